"""Per-token log-probs of a teacher with another tokenizer, carried back onto the student's tokens.

The student's sampled response is decoded to text and re-tokenised by the teacher (`reencode`); the teacher
scores its own tokens; `align_to_student` maps those scores back. The rule:

* every token covers a span of the response text: a student token from the previous token's end to its own end
  (`student_spans`, by decoding), a teacher token by its tokenizer's offsets;
* the ends both tokenizations share cut the text into chunks (the common case, the same split, makes every chunk
  one token of each side);
* a chunk's teacher log-prob is the sum over the teacher tokens that end inside it (log p of the chunk's text),
  shared equally by the student tokens of the chunk, so the per-sequence sum is exact and a one-to-one chunk is
  exact per token;
* a student token with no text (EOS and other special tokens) and one in a chunk no teacher token ends in
  (text the teacher's offsets do not cover) is left out: mask 0.

With the same tokenizer nothing of this runs: the teacher reads the student's ids as they are.
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError


def student_spans(tokenizer: Any, ids: list[int]) -> tuple[str, list[int]]:
    """The decoded response text (special tokens skipped) and each token's end offset in it. Tokens are decoded
    one by one when their pieces add up to the text; otherwise each end is the length of its prefix's decoding
    (tokenizers whose pieces change at word starts or split characters over byte tokens)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids]
    ends: list[int] = []
    if "".join(pieces) == text:
        end = 0
        for piece in pieces:
            end += len(piece)
            ends.append(end)
        return text, ends
    last = 0
    for n in range(1, len(ids) + 1):
        last = min(max(last, len(tokenizer.decode(ids[:n], skip_special_tokens=True))), len(text))
        ends.append(last)
    return text, ends


def teacher_spans(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The teacher's token ids of `text` (no special tokens added) and each token's (start, end) offsets."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError("distillation: a teacher with its own tokenizer needs a fast (Rust) tokenizer for the "
                        "alignment offsets; save the teacher's tokenizer.json (AutoTokenizer use_fast=True)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def align_to_student(student_ends: list[int], teacher_offsets: list[tuple[int, int]],
                     teacher_log_probs: list[float]) -> tuple[list[float], list[float]]:
    """(log-prob, mask) per student token, by the rule of the module docstring."""
    teacher_ends = {end for _, end in teacher_offsets}
    out_lp, out_mask = [0.0] * len(student_ends), [0.0] * len(student_ends)
    chunk_students: list[int] = []
    t, start = 0, 0
    for i, end in enumerate(student_ends):
        if end > start:  # a token with text
            chunk_students.append(i)
        if end in teacher_ends and chunk_students and end > start:
            total, covered = 0.0, False
            while t < len(teacher_offsets) and teacher_offsets[t][1] <= end:
                total += teacher_log_probs[t]
                covered = True
                t += 1
            if covered:
                for j in chunk_students:
                    out_lp[j] = total / len(chunk_students)
                    out_mask[j] = 1.0
            chunk_students = []
        start = max(start, end)
    return out_lp, out_mask
