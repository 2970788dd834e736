"""The SFT trainer: token cross-entropy on the assistant turns of conversations, on the actor's FSDP2 workers.

Read `run_step` top to bottom. The loop around it (resume, validation and checkpoint schedules, tracking,
interrupts) is `TrainerBase`'s; a checkpoint holds the model under `actor/` as the RL trainer's does, so
`rlkit export` and a GRPO run (`actor_rollout_ref.model.path` = the exported folder) read it unchanged.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from rlkit.config.checks import world_size
from rlkit.config.sft_load import thinking_default
from rlkit.config.sft_schema import SFTConfig
from rlkit.controller import ClassWithInitArgs
from rlkit.data.prompt_stream import PromptStream
from rlkit.protocol import Batch
from rlkit.trainer.run.run_plan import GroupPlan, Layout
from rlkit.trainer.run.trainer_base import TrainerBase
from rlkit.trainer.run.workers_setup import WorkerHandles, build_workers, use_gpu
from rlkit.trainer.step.step_metrics import reduce_worker_metrics
from rlkit.workers.micro_batch import MicroBatching, balance_across_ranks
from rlkit.workers.sft_worker import step_loss

SFT_GROUP = "rlkit-sft"  # Ray actor names: "rlkit-sft:0"


def sft_role(cfg: SFTConfig, model_path: str, total_steps: int) -> ClassWithInitArgs:
    """The SFT worker's constructor arguments: its sections, the model path resolved, the micro-batching."""
    from rlkit.workers.sft_worker import SFTWorker

    d = cfg.data
    micro = MicroBatching(d.micro_batch_size_per_gpu, d.use_dynamic_bsz, d.max_token_len_per_gpu)
    return ClassWithInitArgs(SFTWorker, dataclasses.replace(cfg.model, path=str(model_path)), cfg.engine, cfg.optim,
                             total_steps=total_steps, seed=cfg.trainer.seed, micro=micro,
                             packed=d.pad_mode == "no_padding")


def supervised_workers(cfg: SFTConfig, role: ClassWithInitArgs, runtime_env: dict | None = None) -> WorkerHandles:
    """One worker per device (or CPU process), each holding the one role `model` (SFT's worker, DPO's...)."""
    t = cfg.trainer
    layout = Layout([GroupPlan(SFT_GROUP, "sft_pool", ["model"], t.n_gpus_per_node, t.nnodes, t.cpus_per_worker)])
    return build_workers(layout, [{"model": role}], use_gpu(cfg), world_size(cfg), runtime_env,
                         checkpoints=t.default_local_dir)


class SFTTrainer(TrainerBase):
    """Owns the conversations and the SFT workers; `fit()` runs the shared loop."""

    def __init__(self, cfg: SFTConfig, workers: Any = None, tracker: Any = None) -> None:
        from rlkit.data.sampler import RLDataLoader
        from rlkit.models.loading import load_tokenizer
        from rlkit.models.resolve import resolve_model_path

        self.cfg = cfg
        d, t = cfg.data, cfg.trainer
        self.model_path = str(resolve_model_path(cfg.model.path))
        self.tokenizer = load_tokenizer(self.model_path)
        self.train_set, self.val_set = self.load_data()
        self.train_loader = RLDataLoader(self.train_set, d.train_batch_size, shuffle=d.shuffle, seed=t.seed)
        if len(self.train_loader) == 0:
            from rlkit.errors import UserError

            raise UserError(f"data.train_batch_size={d.train_batch_size} is larger than the {len(self.train_set)} "
                            f"training conversations in {d.train_files}; lower it")
        self.total_steps = t.total_training_steps or len(self.train_loader) * t.total_epochs
        self.stream = PromptStream(self.train_loader)
        self.tracker = tracker
        self.global_step = 0
        self.ckpt_root = Path(t.default_local_dir).expanduser()
        self.workers = workers or self.build_workers()

    def load_data(self) -> tuple[Any, Any]:
        """The training set and the validation set (None without data.val_files); a subclass reads other rows."""
        from rlkit.data.sft_dataset import SFTDataset

        d = self.cfg.data
        thinking = thinking_default(d.enable_thinking_default)
        train = SFTDataset(d.train_files, self.tokenizer, d, d.train_max_samples, thinking)
        return train, (SFTDataset(d.val_files, self.tokenizer, d, d.val_max_samples, thinking) if d.val_files else None)

    def worker_role(self) -> ClassWithInitArgs:
        """The role every worker holds (a subclass trains another loss on the same layout)."""
        return sft_role(self.cfg, self.model_path, self.total_steps)

    def build_workers(self) -> WorkerHandles:
        return supervised_workers(self.cfg, self.worker_role())

    # ------------------------------------------------------------------ step
    def next_balanced_batch(self) -> Batch:
        """Phases 1-2 of a step, shared with DPO: the next train_batch_size rows of the stream (epoch after
        epoch, resumable), reordered so each worker gets an equal token count; the step travels with the calls."""
        self.workers.set_step(self.global_step)
        batch = next(self.stream)
        if self.cfg.trainer.balance_batch:
            batch.reorder(balance_across_ranks(batch, self.workers.world_size))
        return batch

    def run_step(self) -> dict[str, float]:
        w = self.workers
        # 1-2. the next train_batch_size conversations, balanced over the workers
        batch = self.next_balanced_batch()
        # 3. one optimizer step: token cross-entropy over the assistant tokens, the shared update loop
        start = time.perf_counter()
        out = w.model.train_batch(batch)
        update_s = time.perf_counter() - start
        # 4. the row: the step's loss (token mean over every rank's micro-batches), lr, grad norm, throughput
        worker_metrics = dict(out.meta.get("metrics", {}))
        loss = step_loss(worker_metrics)
        metrics = reduce_worker_metrics(worker_metrics)
        tokens = float(batch["attention_mask"].sum())
        metrics.update({"train/loss": loss, "train/tokens": tokens,
                        "train/loss_tokens": float(batch["response_mask"].sum()),
                        "perf/tokens_per_s": tokens / max(update_s, 1e-9), "timing_s/update": update_s,
                        "training/epoch": self.train_loader.epoch, **w.memory_peaks()})
        return metrics

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """val/loss: the mean NLL per assistant token of the validation set; val/perplexity = exp of it."""
        assert self.val_set is not None
        start = time.perf_counter()
        total, step = len(self.val_set), self.cfg.data.train_batch_size  # a multiple of the workers
        nll = tokens = 0.0
        for lo in range(0, total, step):
            rows = list(range(lo, min(lo + step, total)))
            rows += [rows[-1]] * ((-len(rows)) % self.workers.world_size)  # equal shards; repeats not counted
            out = self.workers.model.eval_loss(self.val_set.get_batch(rows))
            n = min(lo + step, total) - lo
            nll += float(out["nll_sum"][:n].sum())
            tokens += float(out["loss_tokens"][:n].sum())
            self._progress("validation conversations", lo + n, total)
        loss = nll / max(tokens, 1.0)
        return {"val/loss": loss, "val/perplexity": math.exp(min(loss, 50.0)),
                "timing_s/validate": time.perf_counter() - start}

    # ---------------------------------------------------------- checkpoints
    def save_state(self, folder: Path) -> None:
        self.workers.model.save_checkpoint(str(folder / "actor"))
        self.tokenizer.save_pretrained(folder / "actor" / "tokenizer")

    def load_state(self, folder: Path) -> None:
        self.workers.model.load_checkpoint(str(folder / "actor"))

    def required_files(self) -> list[str]:
        return ["actor/.metadata", "actor/hf_config/config.json"]

    def on_resumed(self, path: Path | None) -> None:
        if path is not None:  # the stream restarts at the loader's resumed position
            self.stream = PromptStream(self.train_loader)
