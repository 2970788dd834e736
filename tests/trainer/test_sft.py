"""`rlkit train sft`'s trainer and worker on real tiny models, in this process (a 1-rank gloo group; no Ray).

- SFT learns: the toy copy task (`rlkit data toy --format sft --length 3`), a random tiny Llama, 40 steps of 32
  conversations: the validation loss falls from ~ln(vocab) to < 0.1 and greedy decoding copies >= 95% of held-out
  prompts exactly (measured 100%); `rlkit export` of the checkpoint gives a plain HF model with the same weights.
- packed (varlen) and right-padded micro-batches, by count or by a token budget: the same loss and gradient (1e-5).
- 2 FSDP2 workers (gloo) = 1 worker: one step on the same 8 conversations leaves the same weights.
- LoRA: only the adapter trains, the loss falls, the export is the merged model.
- resume after SIGKILL: a run killed after its step-3 checkpoint, resumed, ends with the weights of an
  uninterrupted run.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.config.sft_load import load_sft_config
from rlkit.trainer.kinds.sft_trainer import SFTTrainer, sft_role
from rlkit.trainer.run.workers_setup import WorkerHandles
from rlkit.workers.sft_worker import step_loss
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.trainer.conftest import REPO

STEPS, BSZ = 40, 32


@pytest.fixture(scope="module")
def sft_toy(tmp_path_factory) -> Path:
    """`rlkit data toy --format sft --length 3`: "copy the digits : 3 1 4" -> "3 1 4" as the assistant turn."""
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    out = tmp_path_factory.mktemp("toy_sft")
    res = CliRunner().invoke(app, ["data", "toy", "--format", "sft", "--length", "3", "--train-size", "1280",
                                   "--test-size", "32", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", hidden_size=64, layers=2, heads=4)


def overrides(data: Path, model: Path, out: Path, **extra) -> list[str]:
    values = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "model.path": model, "data.train_batch_size": BSZ, "trainer.total_training_steps": STEPS,
        "optim.lr": 1e-2, "optim.weight_decay": 0.0, "optim.lr_warmup_steps": 3,
        "model.enable_gradient_checkpointing": False, "trainer.default_local_dir": out / "ckpt",
        "trainer.resume_mode": "disable", "trainer.logger": "[console]",
    }
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in values.items()]


def in_process_trainer(args: list[str]) -> SFTTrainer:
    """The SFT trainer over one SFTWorker in this process (the worker group's role, called directly)."""
    cfg = load_sft_config(args)
    role = sft_role(cfg, cfg.model.path, cfg.trainer.total_training_steps)
    worker = role.cls(*role.args, **role.kwargs)
    worker.init_model()
    return SFTTrainer(cfg, workers=WorkerHandles([], {"model": worker}, 1))


def greedy_accuracy(model, tokenizer, rows: list[dict]) -> float:
    model.eval()
    hits = 0
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
        out = model.generate(**ids, max_new_tokens=6, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        hits += text.strip() == row["reward_model"]["ground_truth"]
    return hits / len(rows)


@pytest.fixture(scope="module")
def toy_run(process_group, sft_toy, random_model, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("run")
    trainer = in_process_trainer(overrides(sft_toy, random_model, out))
    summary = trainer.fit()
    return trainer, summary, out


def test_sft_learns_the_copy_task_and_exports(toy_run, sft_toy, tmp_path):
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    trainer, summary, out = toy_run
    assert summary.steps == STEPS
    assert summary.first_val["val/loss"] > 2.0 and summary.last_val["val/loss"] < 0.1, summary
    assert summary.last_val["val/perplexity"] == pytest.approx(math.exp(summary.last_val["val/loss"]), rel=1e-9)
    rows = pq.read_table(sft_toy / "test.parquet").to_pylist()
    model = trainer.workers.model.model.module
    assert greedy_accuracy(model, trainer.tokenizer, rows) >= 0.95
    res = CliRunner().invoke(app, ["export", summary.checkpoint, str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, model.state_dict()[name], rtol=0, atol=0, msg=name)


def one_step(model: Path, data: Path, out: Path, batch, **extra) -> tuple[float, torch.Tensor, dict]:
    trainer_args = overrides(data, model, out, **extra)
    cfg = load_sft_config(trainer_args)
    role = sft_role(cfg, str(model), 2)
    worker = role.cls(*role.args, **role.kwargs)
    worker.init_model()
    result = worker.train_batch(batch)
    grads = torch.cat([s["exp_avg"].flatten() for s in worker.model.optimizer.state.values()])
    state = {k: v.clone() for k, v in worker.model.module.state_dict().items()}
    return step_loss(dict(result.meta["metrics"])), grads, state


def varied_batch(toy_run):
    """8 conversations of 1-4 copy turns (lengths differ, so padding and packing differ)."""
    from rlkit.data.sft_dataset import SFTDataset

    trainer = toy_run[0]
    rows = pq.read_table(Path(trainer.cfg.data.train_files).parent / "train.parquet").slice(0, 8).to_pylist()
    convs = [{"messages": [m for r in rows[: 1 + i % 4] for m in r["messages"]]} for i in range(8)]
    path = Path(trainer.cfg.trainer.default_local_dir).parent / "varied.parquet"
    pq.write_table(pa.Table.from_pylist(convs), path)
    ds = SFTDataset(path, trainer.tokenizer, trainer.cfg.data)
    return ds.get_batch(range(len(ds)))


def test_packed_equals_padded_loss_and_gradient(toy_run, sft_toy, random_model, tmp_path):
    batch = varied_batch(toy_run)
    assert batch["attention_mask"].sum(-1).unique().numel() >= 3
    fixed = dict(data__use_dynamic_bsz=False)
    runs = {
        "packed, 2 rows": dict(fixed, data__pad_mode="no_padding", data__micro_batch_size_per_gpu=2),
        "padded, 3 rows": dict(fixed, data__pad_mode="right", data__micro_batch_size_per_gpu=3),
        "packed, 60 tokens": dict(data__pad_mode="no_padding", data__use_dynamic_bsz=True,
                                  data__max_token_len_per_gpu=60),
    }
    results = {name: one_step(random_model, sft_toy, tmp_path, batch, **extra) for name, extra in runs.items()}
    (ref_loss, ref_grad, _), *others = results.values()
    for loss, grad, _ in others:  # the step's loss: a token mean over the whole batch however it is cut
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


def _two_rank_step(rank: int, store: str, payload: dict, results) -> None:
    with gloo_rank(rank, store, results):
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2"})
        batch = payload["batch"]
        half = len(batch) // 2
        cfg = load_sft_config(payload["args"] + ["trainer.n_gpus_per_node=2"])
        role = sft_role(cfg, cfg.model.path, 2)
        worker = role.cls(*role.args, **role.kwargs)
        worker.init_model()
        worker.train_batch(batch.index(torch.arange(rank * half, (rank + 1) * half)))
        state = worker.full_state_dict()
        if rank == 0:
            for name, want in payload["want"].items():
                torch.testing.assert_close(state[name], want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_two_fsdp_workers_equal_one(toy_run, sft_toy, random_model, tmp_path):
    batch = varied_batch(toy_run)
    args = overrides(sft_toy, random_model, tmp_path, data__use_dynamic_bsz=False, data__micro_batch_size_per_gpu=2)
    _, _, one = one_step(random_model, sft_toy, tmp_path, batch, data__use_dynamic_bsz=False,
                         data__micro_batch_size_per_gpu=2)
    run_on_gloo_workers(_two_rank_step, {"batch": batch, "args": args, "want": one}, tmp_path)


def test_lora_sft_trains_the_adapter_only(process_group, sft_toy, random_model, tmp_path):
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    trainer = in_process_trainer(overrides(sft_toy, random_model, tmp_path, model__lora_rank=8, model__lora_alpha=16,
                                           trainer__total_training_steps=8, optim__lr=2e-2))
    fsdp = trainer.workers.model.model
    base = {k: v.clone() for k, v in fsdp.module.state_dict().items() if "lora_" not in k}
    summary = trainer.fit()
    assert summary.last_val["val/loss"] < summary.first_val["val/loss"] - 0.3, summary  # measured 4.13 -> 3.70
    assert all("lora_" in n for n, p in fsdp.module.named_parameters() if p.requires_grad)
    for name, value in fsdp.module.state_dict().items():
        if name in base:
            torch.testing.assert_close(value, base[name], rtol=0, atol=0, msg=name)
    res = CliRunner().invoke(app, ["export", summary.checkpoint, str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "merged" / "config.json").is_file()


RESUME_STEPS = 6


def resume_main(args: list[str]) -> None:
    """The killed run's process: the trainer in a 1-rank group of its own (`python -c` from the test)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(args[0], 1), rank=0, world_size=1)
    in_process_trainer(args[1:]).fit()


@pytest.mark.slow
def test_resume_after_sigkill_continues_exactly(process_group, sft_toy, random_model, tmp_path):
    common = dict(trainer__total_training_steps=RESUME_STEPS, trainer__save_freq=1, data__val_files="null",
                  data__train_batch_size=8)
    straight = in_process_trainer(overrides(sft_toy, random_model, tmp_path / "a", **common))
    straight.fit()
    want = straight.workers.model.model.module.state_dict()

    args = overrides(sft_toy, random_model, tmp_path / "b", **(common | {"trainer__resume_mode": "auto"}))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    code = "import sys; from tests.trainer.test_sft import resume_main; resume_main(sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "store"), *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = tmp_path / "b" / "ckpt" / "global_step_3"
    deadline = time.monotonic() + 240
    while not marker.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert marker.is_dir(), err.decode()[-2000:]
    done = sorted(p.name for p in marker.parent.glob("global_step_*"))
    assert f"global_step_{RESUME_STEPS}" not in done, done  # killed before the end

    resumed = in_process_trainer(args)
    steps = []
    run_step = resumed.run_step
    resumed.run_step = lambda: (steps.append(resumed.global_step), run_step())[1]
    resumed.fit()
    assert steps and steps[0] > 3 and steps[-1] == RESUME_STEPS, steps
    got = resumed.workers.model.model.module.state_dict()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7, msg=name)
