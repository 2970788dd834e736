"""The teacher phase of a distillation step: every sampled token's log-prob under the row's teacher.

Rows go to the teacher whose `key` equals their `distillation.teacher_key` column (a teacher with key null takes
every row). A local teacher with the student's tokenizer reads the batch's ids as they are; one with its own
tokenizer gets the prompt and response re-tokenised and its log-probs aligned back to the student's tokens
(rlkit/data/token_alignment.py states the rule); a served teacher is asked over HTTP (served_teacher.py).
The result is `teacher_log_probs` (B, R) and `teacher_mask` (B, R), 0 where no teacher scored a token: a row
without a teacher, a failed request, text the alignment could not place. Those are counted in the metrics
(`distill/unscored_rows`, `distill/teacher_failed`), never raised.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlkit.algo.distill_loss import DISTILL_LOSSES
from rlkit.config.distillation import PREFIX, TeacherModelConfig, teachers
from rlkit.config.schema import RLConfig
from rlkit.controller import WorkerGroupView
from rlkit.data.token_alignment import align_to_student, student_spans, teacher_spans
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.step.served_teacher import ServedTeacher

log = logging.getLogger("rlkit.trainer")


@dataclass
class Teacher:
    """One teacher as the stage uses it: its tokenizer (None = the student's) and, when served, its client."""

    name: str
    cfg: TeacherModelConfig
    tokenizer: Any = None
    served: ServedTeacher | None = None


def local_teacher_paths(cfg: RLConfig) -> dict[str, TeacherModelConfig]:
    """The local teachers with `model_path` resolved to a local folder (the teacher role's constructor input)."""
    import dataclasses

    from rlkit.models.resolve import resolve_model_path

    return {name: dataclasses.replace(t, model_path=str(resolve_model_path(t.model_path)))
            for name, t in teachers(cfg.distillation).items() if not t.served}


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers give the same ids to the same text (same vocabulary and special tokens)."""
    return a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids


class TeacherStage:
    def __init__(self, cfg: RLConfig, student_tokenizer: Any, worker: WorkerGroupView | None,
                 local_paths: dict[str, TeacherModelConfig]) -> None:
        """`worker`: the teacher role (None when every teacher is served); `local_paths`: the local teachers with
        resolved folders (`local_teacher_paths`)."""
        from rlkit.models.loading import load_tokenizer

        d = cfg.distillation
        self.key, self.student_tok, self.worker = d.teacher_key, student_tokenizer, worker
        self.topk = d.distillation_loss.topk if DISTILL_LOSSES.get(d.distillation_loss.loss_mode).topk else None
        self.teachers: list[Teacher] = []
        for name, t in teachers(d).items():
            where = f"{PREFIX}teacher_models.{name}"
            if t.inference:
                log.warning("%s.inference: nothing to set (%s): rlkit's local teacher is a frozen FSDP2 forward, "
                            "not an inference engine", where, ", ".join(sorted(t.inference)))
            path = t.tokenizer_path or (None if t.served else local_paths[name].model_path)
            tok = load_tokenizer(path) if path else None
            if tok is not None and same_tokenizer(tok, student_tokenizer):
                tok = None
            if tok is not None and self.topk is not None:
                raise UserError(f"{where}: its tokenizer differs from the student's, so its top-k ids mean other "
                                f"tokens: forward_kl_topk needs a teacher with the student's tokenizer; use loss_mode "
                                "k1 or k3")
            self.teachers.append(Teacher(name, t, tok, ServedTeacher(t, where) if t.served else None))

    # ------------------------------------------------------------------ the phase
    def __call__(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        rows, width = batch["responses"].shape
        lp, mask = torch.zeros(rows, width), torch.zeros(rows, width)
        k = self.topk or 0
        top_ids, top_lp = torch.zeros(rows, width, k, dtype=torch.long), torch.zeros(rows, width, k)
        claimed = np.zeros(rows, dtype=bool)
        failed = 0
        column = batch.non_tensors.get(self.key)
        for teacher in self.teachers:
            if teacher.cfg.key is None:
                picked = np.flatnonzero(~claimed)
            else:
                if column is None:
                    raise UserError(f"{PREFIX}teacher_key={self.key}: the batch has no such column; name one of "
                                    f"{sorted(batch.non_tensors)}")
                picked = np.flatnonzero((column.astype(str) == str(teacher.cfg.key)) & ~claimed)
            if len(picked) == 0:
                continue
            claimed[picked] = True
            sub = batch.index(picked)
            out = self._score(teacher, sub)
            idx = torch.as_tensor(picked)
            lp[idx], mask[idx] = out["teacher_log_probs"], out["teacher_mask"]
            failed += int(out.meta.get("failed", 0))
            if k:
                top_ids[idx], top_lp[idx] = out["teacher_topk_ids"], out["teacher_topk_log_probs"]
        mask = mask * batch["response_mask"].float()
        tensors = {"teacher_log_probs": lp, "teacher_mask": mask}
        if k:
            tensors.update(teacher_topk_ids=top_ids, teacher_topk_log_probs=top_lp)
        resp = batch["response_mask"].float().sum().clamp(min=1)
        metrics = {"distill/unscored_rows": float((~claimed).sum()), "distill/teacher_failed": float(failed),
                   "distill/scored_token_frac": float(mask.sum() / resp)}
        return Batch(tensors), metrics

    def _score(self, teacher: Teacher, sub: Batch) -> Batch:
        """teacher_log_probs and teacher_mask (+ top-k) of `sub`'s rows, in the student's tokens; meta `failed`."""
        if teacher.tokenizer is None and teacher.served is None:
            keys = ["input_ids", "attention_mask", "position_ids", "responses"]
            out = self.worker.compute_teacher_log_prob(sub.select(keys), teacher=teacher.name)
            out["teacher_mask"] = torch.ones_like(out["teacher_log_probs"])
            return out
        if teacher.tokenizer is None:  # served, the student's tokenizer: the ids as they are
            return self._served_same(teacher, sub)
        return self._retokenised(teacher, sub)

    def _served_same(self, teacher: Teacher, sub: Batch) -> Batch:
        prompts, responses = _valid_ids(sub)
        scored = teacher.served.score([p + r for p, r in zip(prompts, responses)])
        lp, mask = torch.zeros(sub["responses"].shape), torch.zeros(sub["responses"].shape)
        failed = 0
        for row, (p, r, s) in enumerate(zip(prompts, responses, scored)):
            if s.log_probs is None:
                failed += 1
                continue
            values = s.log_probs[len(p) - 1:]
            lp[row, :len(r)] = torch.tensor(values, dtype=torch.float32)
            mask[row, :len(r)] = 1.0
        return Batch({"teacher_log_probs": lp, "teacher_mask": mask}, meta={"failed": failed})

    def _retokenised(self, teacher: Teacher, sub: Batch) -> Batch:
        """The rows in the teacher's tokens, scored (locally or served), aligned back to the student's."""
        tok = teacher.tokenizer
        prompts, responses = _valid_ids(sub)
        raw = sub.non_tensors.get("raw_prompt")
        t_prompts, t_responses, offsets, ends = [], [], [], []
        for row, (p, r) in enumerate(zip(prompts, responses)):
            if raw is not None and getattr(tok, "chat_template", None):
                text = tok.apply_chat_template(list(raw[row]), add_generation_prompt=True, tokenize=False)
                t_prompt = list(tok(text, add_special_tokens=False)["input_ids"])
            else:
                t_prompt = list(tok(self.student_tok.decode(p, skip_special_tokens=True))["input_ids"])
            text, student_ends = student_spans(self.student_tok, r)
            ids, offs = teacher_spans(tok, text)
            t_prompts.append(t_prompt or [tok.bos_token_id or tok.eos_token_id or 0])
            t_responses.append(ids)
            offsets.append(offs)
            ends.append(student_ends)
        failed = 0
        if teacher.served is not None:
            scored = teacher.served.score([p + r for p, r in zip(t_prompts, t_responses)])
            per_row = []
            for p, s in zip(t_prompts, scored):
                failed += s.log_probs is None
                per_row.append(None if s.log_probs is None else s.log_probs[len(p) - 1:])
        else:
            out = self.worker.compute_teacher_log_prob(_teacher_batch(t_prompts, t_responses, tok),
                                                       teacher=teacher.name)
            per_row = [out["teacher_log_probs"][row, :len(r)].tolist() for row, r in enumerate(t_responses)]
        lp, mask = torch.zeros(sub["responses"].shape), torch.zeros(sub["responses"].shape)
        for row, values in enumerate(per_row):
            if values is None:
                continue
            a_lp, a_mask = align_to_student(ends[row], offsets[row], values)
            lp[row, :len(a_lp)] = torch.tensor(a_lp)
            mask[row, :len(a_mask)] = torch.tensor(a_mask)
        return Batch({"teacher_log_probs": lp, "teacher_mask": mask}, meta={"failed": failed})


def _valid_ids(batch: Batch) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's prompt ids (left padding dropped) and response ids (up to its last trained token)."""
    prompts_t, mask = batch["prompts"], batch["attention_mask"]
    plen = prompts_t.shape[1]
    prompts = [prompts_t[i][mask[i, :plen].bool()].tolist() for i in range(len(batch))]
    resp_mask = mask[:, plen:]
    responses = [batch["responses"][i][: int(resp_mask[i].sum())].tolist() for i in range(len(batch))]
    return prompts, responses


def _teacher_batch(prompts: list[list[int]], responses: list[list[int]], tok: Any) -> Batch:
    """Rows in the teacher's tokens, laid out as the rollout lays out the student's (left-padded prompt,
    right-padded response)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    p_len = max(len(p) for p in prompts)
    r_len = max(1, max(len(r) for r in responses))
    rows = len(prompts)
    ids = torch.full((rows, p_len + r_len), pad, dtype=torch.long)
    att = torch.zeros((rows, p_len + r_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, p_len - len(p):p_len] = torch.tensor(p)
        att[i, p_len - len(p):p_len] = 1
        if r:
            ids[i, p_len:p_len + len(r)] = torch.tensor(r)
            att[i, p_len:p_len + len(r)] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": att, "position_ids": pos, "responses": ids[:, p_len:]})
