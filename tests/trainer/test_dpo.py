"""`rlkit train dpo`'s trainer on a real tiny model, in this process (a 1-rank gloo group; no Ray), one shared run.

DPO learns a marker: the pairs' chosen replies end in "think", their rejected replies in a digit. 15 steps of 8 pairs
(lr 1e-2, beta 0.1): on held-out pairs the policy's own preference (log p(chosen) > log p(rejected)) rises from
~chance (measured 0.12: the random model finds a digit likelier) to > 0.9 (measured 1.00), DPO's rewards/accuracies
to > 0.9, and the policy's sampled replies contain the marker more often (measured 0.11 -> 0.91). The checkpoint
exports to a plain HF model; `--dry-run` prints the plan with the loss and the reference.

dpo.ref.precompute: 3 shuffled steps log the very losses and rewards of the per-step reference (measured: equal bit
for bit), with no reference phase and the reference's weights released; a resume from step 2 logs step 3 the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.config.dpo_load import load_dpo_config
from rlkit.errors import UserError
from rlkit.trainer.kinds.dpo_trainer import DPOTrainer, dpo_role
from rlkit.trainer.run.workers_setup import WorkerHandles

MARKER = "think"
STEPS, BSZ = 15, 8


def marker_pairs(n: int, seed: int) -> list[dict]:
    """copy-the-digits prompts; chosen = the digits + the marker, rejected = the digits + one more digit."""
    rng = np.random.default_rng(seed)
    rows = []
    for digits in rng.integers(0, 10, size=(n, 3)):
        text = " ".join(map(str, digits))
        rows.append({"prompt": [{"role": "user", "content": f"copy the digits : {text}"}],
                     "chosen": f"{text} {MARKER}", "rejected": f"{text} {rng.integers(0, 10)}"})
    return rows


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pairs")
    for name, n, seed in (("train", STEPS * BSZ, 0), ("test", 64, 1)):
        pq.write_table(pa.Table.from_pylist(marker_pairs(n, seed)), out / f"{name}.parquet")
    return out


def overrides(data: Path, model: Path, out: Path) -> list[str]:
    values = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet", "model.path": model,
        "data.train_batch_size": BSZ, "data.micro_batch_size_per_gpu": BSZ, "data.use_dynamic_bsz": False,
        "data.max_length": 48, "dpo.max_prompt_length": 32, "trainer.total_training_steps": STEPS,
        "optim.lr": 1e-2, "optim.weight_decay": 0.0, "optim.lr_warmup_steps": 0,
        "model.enable_gradient_checkpointing": False, "trainer.default_local_dir": out / "ckpt",
        "trainer.resume_mode": "disable", "trainer.logger": "[console]", "data.shuffle": False,
    }
    return [f"{k}={v}" for k, v in values.items()]


def marker_rate(model, tokenizer, data: Path, samples: int = 4) -> float:
    """The share of sampled replies (6 tokens, temperature 1) to the held-out prompts that contain the marker."""
    rows = pq.read_table(data / "test.parquet").to_pylist()
    prompts = torch.tensor([tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, return_dict=True)
                            ["input_ids"] for r in rows])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(prompts, do_sample=True, max_new_tokens=6, num_return_sequences=samples,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    marker = tokenizer.convert_tokens_to_ids(MARKER)
    return float((out[:, prompts.shape[1]:] == marker).any(-1).float().mean())


@pytest.fixture(scope="module")
def dpo_run(process_group, pairs, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from rlkit.testing import save_tiny_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("run")
    model = save_tiny_model(root / "tiny", heads=2, tie_embeddings=True)
    cfg = load_dpo_config(overrides(pairs, model, root))
    role = dpo_role(cfg, str(model), str(model), STEPS)
    worker = role.cls(*role.args, **role.kwargs)
    worker.init_model()
    trainer = DPOTrainer(cfg, workers=WorkerHandles([], {"model": worker}, 1))
    start_model = AutoModelForCausalLM.from_pretrained(model).eval()
    before = marker_rate(start_model, trainer.tokenizer, pairs)
    summary = trainer.fit()
    return trainer, summary, before


def test_dpo_learns_the_marker(dpo_run, pairs):
    trainer, summary, marker_before = dpo_run
    first, last = summary.first_val, summary.last_val
    assert summary.steps == STEPS
    assert first["val/rewards/accuracies"] == 0.0 and first["val/loss"] == pytest.approx(np.log(2), abs=1e-5)
    assert first["val/logps/accuracies"] < 0.6 and last["val/logps/accuracies"] > 0.9, (first, last)
    assert last["val/rewards/accuracies"] > 0.9 and last["val/rewards/margins"] > 0 and last["val/loss"] < 0.3
    assert last["val/rewards/chosen"] > last["val/rewards/rejected"]
    marker_after = marker_rate(trainer.workers.model.model.module, trainer.tokenizer, pairs)
    print(f"logps/accuracies {first['val/logps/accuracies']:.2f} -> {last['val/logps/accuracies']:.2f}, "
          f"marker {marker_before:.2f} -> {marker_after:.2f}, "
          f"rewards/accuracies -> {last['val/rewards/accuracies']:.2f}")
    assert marker_after > marker_before + 0.3


def test_checkpoint_exports_the_policy(dpo_run, tmp_path):
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    trainer, summary, _ = dpo_run
    res = CliRunner().invoke(app, ["export", summary.checkpoint, str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    policy = trainer.workers.model.model.module.state_dict()
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, policy[name], rtol=0, atol=0, msg=name)


def test_dry_run_and_bad_keys(pairs, tmp_path):
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    args = overrides(pairs, Path("smollm2-135m-instruct"), tmp_path)  # an alias: resolved at start, not by dry runs
    res = CliRunner().invoke(app, ["train", "dpo", *args, "dpo.loss_type=ipo", "dpo.beta=0.5", "--dry-run"],
                             env={"COLUMNS": "200"})
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "resource plan (dpo)" in out and "ipo (beta 0.5)" in out
    assert "smollm2-135m-instruct, frozen, in each worker" in out and "pre-flight ok: 2 data file(s)" in out
    res = CliRunner().invoke(app, ["train", "dpo", *args, "dpo.ref.precompute=true", "--dry-run"],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "scores every training and validation pair once before step 1" in " ".join(res.output.split())
    with pytest.raises(UserError, match="data.messages_key: a conversation key of SFT"):
        load_dpo_config([*args, "data.messages_key=conversation"])
    with pytest.raises(UserError, match=r"dpo.label_smoothing=0.5 must be in \[0, 0.5\)"):
        load_dpo_config([*args, "dpo.label_smoothing=0.5"])
    with pytest.raises(UserError, match="Did you mean 'sigmoid'"):
        DPOTrainer(load_dpo_config([*args, "dpo.loss_type=sigmoidd"]), workers=object())


class Rows:
    """A tracker that keeps every logged row and progress line."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}
        self.progress_lines: list[tuple[str, int, int]] = []

    def log(self, metrics: dict, step: int) -> None:
        self.rows.setdefault(step, {}).update(metrics)

    def progress(self, phase: str, done: int, total: int) -> None:
        self.progress_lines.append((phase, done, total))


def short_run(process_group, pairs: Path, model: Path, out: Path, steps: int, **extra) -> tuple[DPOTrainer, Rows]:
    """`steps` steps of the shared config, shuffled (so a step's rows are not the precompute's chunks)."""
    values = {"trainer.total_training_steps": steps, "data.shuffle": True, "trainer.test_freq": 2, **extra}
    args = [a for a in overrides(pairs, model, out) if a.split("=")[0] not in values]
    cfg = load_dpo_config([*args, *(f"{k}={v}" for k, v in values.items())])
    role = dpo_role(cfg, str(model), str(model), steps)
    worker = role.cls(*role.args, **role.kwargs)
    worker.init_model()
    rows = Rows()
    trainer = DPOTrainer(cfg, workers=WorkerHandles([], {"model": worker}, 1), tracker=rows)
    trainer.fit()
    return trainer, rows


SCORES = ("train/loss", "rewards/", "logps/", "val/loss", "val/rewards/", "val/logps/")


def test_precomputed_reference_matches_the_per_step_reference(process_group, pairs, tmp_path):
    from rlkit.testing import save_tiny_model

    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "tiny", heads=2, tie_embeddings=True)
    live, live_rows = short_run(process_group, pairs, model, tmp_path / "live", 3)
    stored, stored_rows = short_run(process_group, pairs, model, tmp_path / "stored", 3,
                                    **{"dpo.ref.precompute": True, "trainer.save_freq": 2})
    assert sorted(live_rows.rows) == sorted(stored_rows.rows) == [0, 1, 2, 3]
    worst = 0.0
    for step, row in live_rows.rows.items():
        scores = {k: v for k, v in row.items() if k.startswith(SCORES)}
        assert scores and scores.keys() <= stored_rows.rows[step].keys()
        for key, value in scores.items():
            worst = max(worst, abs(stored_rows.rows[step][key] - value))
            assert stored_rows.rows[step][key] == pytest.approx(value, abs=1e-6), (step, key)
    print(f"precomputed vs per-step reference: largest difference {worst:.3g}")
    for step in (1, 2, 3):
        assert live_rows.rows[step]["timing_s/ref"] > 0 and "timing_s/ref" not in stored_rows.rows[step]
    ref_mb = live.workers.model.memory_report()["ref_mb"]
    assert ref_mb > 0 and stored.workers.model.memory_report()["ref_mb"] == 0 and stored.ref_freed_mb == ref_mb
    phases = {phase for phase, _, _ in stored_rows.progress_lines}
    assert {"reference log-probs (training pairs)", "reference log-probs (validation pairs)"} <= phases
    with pytest.raises(RuntimeError, match="reference was released"):
        stored.workers.model.compute_ref_log_prob(stored.train_set.get_batch([0, 1]))
    # a resume scores the pairs again (nothing is checkpointed) and picks each step's pairs by their dataset rows
    step2 = tmp_path / "stored" / "ckpt" / "global_step_2"
    _, resumed_rows = short_run(process_group, pairs, model, tmp_path / "resumed", 3,
                                **{"dpo.ref.precompute": True, "trainer.resume_mode": step2})
    assert sorted(resumed_rows.rows) == [3]
    assert {k: v for k, v in resumed_rows.rows[3].items() if k.startswith(SCORES)} == \
        {k: v for k, v in stored_rows.rows[3].items() if k.startswith(SCORES)}
