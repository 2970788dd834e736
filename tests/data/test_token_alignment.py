"""Teacher log-probs in another tokenizer's tokens, aligned back to the student's (rlkit/data/token_alignment.py).

Two handmade tokenizers split the same text differently: the student's into pieces of 2 characters, the teacher's
into pieces of 3, so "abcabcb a" is ab|ca|bc|b |a for the student and abc|abc|b a for the teacher; their
shared ends (6, 9) cut it into two chunks.
"""

from __future__ import annotations

import itertools

import pytest

from rlkit.data.token_alignment import align_to_student, student_spans, teacher_spans

TEXT = "abcabcb a"


def chunked_tokenizer(size: int):
    """A fast tokenizer over "abc " splitting text into pieces of `size` characters (a small alphabet: building a
    tokenizer with a large vocabulary takes transformers seconds)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2}
    for n in range(1, size + 1):
        for piece in itertools.product("abc ", repeat=n):
            vocab.setdefault("".join(piece), len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(f".{{1,{size}}}"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizers():
    return chunked_tokenizer(2), chunked_tokenizer(3)


def test_the_two_tokenizers_split_differently(tokenizers):
    student, teacher = tokenizers
    assert student.tokenize(TEXT) == ["ab", "ca", "bc", "b ", "a"]
    assert teacher.tokenize(TEXT) == ["abc", "abc", "b a"]


def test_chunk_log_probs_are_shared_by_the_student_tokens_and_eos_is_left_out(tokenizers):
    student, teacher = tokenizers
    ids = student(TEXT, add_special_tokens=False)["input_ids"] + [student.eos_token_id]
    text, ends = student_spans(student, ids)
    assert text == TEXT and ends == [2, 4, 6, 8, 9, 9]  # EOS: no text
    t_ids, offsets = teacher_spans(teacher, text)
    assert teacher.convert_ids_to_tokens(t_ids) == ["abc", "abc", "b a"] and offsets == [(0, 3), (3, 6), (6, 9)]
    lp, mask = align_to_student(ends, offsets, [-0.3, -0.6, -1.0])
    # chunk "abcabc": teacher -0.3 + -0.6 over 3 student tokens; chunk "b a": -1.0 over 2; EOS masked
    assert lp == pytest.approx([-0.3, -0.3, -0.3, -0.5, -0.5, 0.0])
    assert mask == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert sum(lp) == pytest.approx(-0.3 - 0.6 - 1.0)  # the sequence's log-prob is kept exactly


def test_the_same_split_aligns_token_for_token(tokenizers):
    student, _ = tokenizers
    ids = student(TEXT, add_special_tokens=False)["input_ids"]
    text, ends = student_spans(student, ids)
    t_ids, offsets = teacher_spans(student, text)
    assert t_ids == ids
    lp, mask = align_to_student(ends, offsets, [-1.0, -2.0, -3.0, -4.0, -5.0])
    assert lp == [-1.0, -2.0, -3.0, -4.0, -5.0] and mask == [1.0] * 5


def test_the_teacher_split_finer_sums_into_the_student_token(tokenizers):
    """The other way round: the teacher (2-character pieces) splits finer than the student (3)."""
    teacher, student = tokenizers
    ids = student(TEXT, add_special_tokens=False)["input_ids"]
    text, ends = student_spans(student, ids)
    _, offsets = teacher_spans(teacher, text)
    lp, mask = align_to_student(ends, offsets, [-0.1, -0.2, -0.3, -0.4, -0.5])
    # student abc|abc|b a; teacher ends 2,4,6,8,9: chunk abcabc = 3 teacher tokens over 2 student tokens
    assert lp == pytest.approx([-0.3, -0.3, -0.9]) and mask == [1.0, 1.0, 1.0]


def test_text_the_teacher_does_not_cover_is_masked():
    lp, mask = align_to_student([2, 4], [(0, 2)], [-1.0])
    assert lp == [-1.0, 0.0] and mask == [1.0, 0.0]
