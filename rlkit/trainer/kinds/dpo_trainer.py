"""The DPO trainer: a preference loss (rlkit.algo.preference_loss) on (prompt, chosen, rejected) pairs, on the SFT
trainer's FSDP2 workers, with the frozen reference held beside the policy in each worker (rlkit.workers.dpo_worker),
or (dpo.ref.precompute) scored once over the data and dropped (rlkit.trainer.kinds.dpo_reference).

Read `run_step` top to bottom. Everything else is the SFT trainer's (the loop of `TrainerBase`, checkpoints under
`actor/`, resume, export): a DPO checkpoint is read by `rlkit export`, `rlkit eval` and a GRPO run unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from rlkit.algo.preference_loss import PREFERENCE_LOSSES, preference_loss
from rlkit.config.dpo_schema import DPOConfig
from rlkit.controller import ClassWithInitArgs
from rlkit.data.preference import split_sides
from rlkit.protocol import Batch
from rlkit.trainer.kinds.dpo_reference import StoredReference, chunks
from rlkit.trainer.kinds.sft_trainer import SFTTrainer
from rlkit.trainer.step.step_metrics import reduce_worker_metrics
from rlkit.workers.micro_batch import MicroBatching

log = logging.getLogger(__name__)


def dpo_role(cfg: DPOConfig, model_path: str, ref_path: str, total_steps: int) -> ClassWithInitArgs:
    """The DPO worker's constructor arguments: the SFT role's, the dpo section and the reference's folder."""
    from rlkit.workers.dpo_worker import DPOWorker

    d = cfg.data
    micro = MicroBatching(d.micro_batch_size_per_gpu, d.use_dynamic_bsz, d.max_token_len_per_gpu)
    return ClassWithInitArgs(DPOWorker, dataclasses.replace(cfg.model, path=model_path), cfg.engine, cfg.optim,
                             cfg.dpo, ref_path=ref_path, total_steps=total_steps, seed=cfg.trainer.seed, micro=micro,
                             packed=d.pad_mode == "no_padding")


class DPOTrainer(SFTTrainer):
    """Owns the preference pairs and the DPO workers; `fit()` runs the shared loop."""

    cfg: DPOConfig

    def __init__(self, cfg: DPOConfig, workers: Any = None, tracker: Any = None) -> None:
        PREFERENCE_LOSSES.get(cfg.dpo.loss_type)  # a misspelt dpo.loss_type fails before the workers start
        self.stored_ref: StoredReference | None = None  # dpo.ref.precompute's scores, from the first start on
        self.ref_freed_mb = 0.0  # the reference's weights each worker dropped after the precompute
        super().__init__(cfg, workers, tracker)

    def load_data(self) -> tuple[Any, Any]:
        from rlkit.data.preference import PreferenceDataset

        d, p = self.cfg.data, self.cfg.dpo

        def pairs(files: Any, limit: int | None) -> PreferenceDataset:
            return PreferenceDataset(files, self.tokenizer, max_prompt_length=p.max_prompt_length,
                                     max_length=d.max_length, truncation=d.truncation, max_samples=limit)

        return pairs(d.train_files, d.train_max_samples), (pairs(d.val_files, d.val_max_samples) if d.val_files
                                                           else None)

    def worker_role(self) -> ClassWithInitArgs:
        from rlkit.models.resolve import resolve_model_path

        ref = self.cfg.dpo.ref.model_path
        ref_path = str(resolve_model_path(ref)) if ref else self.model_path
        return dpo_role(self.cfg, self.model_path, ref_path, self.total_steps)

    def on_resumed(self, path: Any) -> None:
        """With dpo.ref.precompute: score every pair with the reference (once per process: the scores outlive a
        worker restart), then drop the reference from the workers (again after a restart, which rebuilt it)."""
        super().on_resumed(path)
        if not self.cfg.dpo.ref.precompute:
            return
        w = self.workers
        if self.stored_ref is None:
            self.stored_ref = StoredReference.compute(w.model, self.train_set, self.val_set,
                                                      self.cfg.data.train_batch_size, w.world_size, self._progress)
        freed = w.model.release_reference()  # one report per worker (one dict from a worker called in-process)
        self.ref_freed_mb = max(r["ref_freed_mb"] for r in (freed if isinstance(freed, list) else [freed]))
        log.warning("dpo.ref.precompute: %d pairs scored in %.1fs (%.1f KiB kept); the reference is released: %.1f "
                    "MiB of weights freed per worker", len(self.stored_ref.train), self.stored_ref.seconds,
                    self.stored_ref.nbytes() / 2**10, self.ref_freed_mb)

    # ------------------------------------------------------------------ step
    def run_step(self) -> dict[str, float]:
        w = self.workers
        # 1-2. the next train_batch_size pairs (one row each: chosen ++ rejected), balanced over the workers
        batch = self.next_balanced_batch()
        # 3. the frozen reference's log-probs of both completions: stored once (dpo.ref.precompute) or scored now
        start = time.perf_counter()
        if self.stored_ref is not None:
            batch["ref_logps"] = self.stored_ref.train[batch["pair_index"]]
        else:
            batch = batch.union(w.model.compute_ref_log_prob(batch))
        ref_s = time.perf_counter() - start
        # 4. one optimizer step on the preference loss (+ rpo_alpha x NLL), the shared update loop
        start = time.perf_counter()
        out = w.model.train_batch(batch)
        update_s = time.perf_counter() - start
        # 5. the row: loss, TRL's rewards/* and logps/* (means over every rank's micro-batches), lr, throughput
        metrics = reduce_worker_metrics(out.meta.get("metrics", {}))
        tokens = float(batch["attention_mask"].sum())
        metrics.update({"train/tokens": tokens, "perf/tokens_per_s": tokens / max(ref_s + update_s, 1e-9),
                        "timing_s/update": update_s, "training/epoch": self.train_loader.epoch,
                        **w.memory_peaks()})
        if self.stored_ref is None:  # no reference phase in a step of a precomputed run
            metrics["timing_s/ref"] = ref_s
        return metrics

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """The preference loss and TRL's metrics over every validation pair: val/loss, val/rewards/accuracies, ..."""
        assert self.val_set is not None
        start = time.perf_counter()
        total, done = len(self.val_set), 0
        parts: list[Batch] = []
        # chunks of train_batch_size (a multiple of the workers), as the precompute scored them
        for rows, n in chunks(total, self.cfg.data.train_batch_size, self.workers.world_size):
            batch = self.val_set.get_batch(rows)
            if self.stored_ref is not None and self.stored_ref.val is not None:
                ref = {"ref_logps": self.stored_ref.val[rows[:n]]}
            else:
                ref = {"ref": self.workers.model.compute_ref_log_prob(batch)["ref_log_prob"][:n]}
            policy = self.workers.model.compute_log_prob(batch)["log_probs"]
            parts.append(Batch({"mask": batch["response_mask"][:n], "policy": policy[:n], **ref}))
            done += n
            self._progress("validation pairs", done, total)
        metrics = self.pair_metrics(parts)
        return {**{f"val/{k}": v for k, v in metrics.items()}, "timing_s/validate": time.perf_counter() - start}

    def pair_metrics(self, parts: list[Batch]) -> dict[str, float]:
        """The loss and TRL's metrics over the chunks' pairs (each chunk weighs its pairs), and `logps/accuracies`: how
        often the policy itself finds the chosen completion likelier (~chance before training, unlike
        rewards/accuracies, which is 0 while the policy is the reference)."""
        d = self.cfg.dpo
        sums: dict[str, float] = {}
        count = 0
        for part in parts:
            masks = split_sides(part["mask"])
            refs = part["ref_logps"].unbind(1) if "ref_logps" in part else split_sides(part["ref"])
            out = preference_loss(*split_sides(part["policy"]), *refs, *masks,
                                  loss_type=d.loss_type, beta=d.beta, label_smoothing=d.label_smoothing,
                                  rpo_alpha=d.rpo_alpha)
            out["logps/accuracies"] = policy_prefers_chosen(part["policy"], part["mask"]).float().mean()
            for key, value in out.items():
                sums[key] = sums.get(key, 0.0) + float(value) * len(part)
            count += len(part)
        return {key: value / max(count, 1) for key, value in sums.items()}


def policy_prefers_chosen(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per pair: whether the policy's own log-likelihood of the chosen completion beats the rejected one's."""
    chosen, rejected = split_sides(log_probs)
    c_mask, r_mask = split_sides(mask.to(log_probs.dtype))
    return (chosen * c_mask).sum(-1) > (rejected * r_mask).sum(-1)
