"""LoRA (rlkit/models/lora.py + FSDPModel): the merged weight stream, the reference with the adapter off,
adapter-only optimizer and checkpoints, and both export formats.

All on the tiny Llama in float32 on CPU; the adapter is given random non-zero weights (peft starts
B = 0, where "merged == base" would pass for any merge bug).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.schema import FSDPConfig, ModelConfig, OptimConfig
from rlkit.models.lora import (
    adapter_state_dict,
    lora_enabled,
    merged_named_tensors,
    save_adapter_folder,
    wrap_lora,
)
from rlkit.testing import save_tiny_model

LORA = ModelConfig(lora_rank=4, lora_alpha=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lora") / "tiny", tie_embeddings=True)


def randomize_adapter(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def tokens(rows: int = 3, length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 60, (rows, length), generator=torch.Generator().manual_seed(seed))


def log_probs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_lora_enabled_reads_rank_or_adapter_path():
    assert not lora_enabled(ModelConfig())
    assert lora_enabled(LORA)
    assert lora_enabled(ModelConfig(lora_adapter_path="/some/adapter"))


def test_merged_stream_has_the_base_names_and_gives_the_peft_models_log_probs(tiny):
    base = AutoModelForCausalLM.from_pretrained(tiny)
    wrapped = wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), LORA)
    randomize_adapter(wrapped.hf_model)
    assert all(".lora_" in n for n, p in wrapped.hf_model.named_parameters() if p.requires_grad)

    merged = dict(merged_named_tensors(wrapped.hf_model.state_dict().items(), wrapped.scalings()))
    assert set(merged) == set(base.state_dict())  # the engine's (base model's) HF names, nothing else
    assert all(merged[k].shape == v.shape for k, v in base.state_dict().items())
    target = AutoModelForCausalLM.from_pretrained(tiny)
    target.load_state_dict(merged)

    ids = tokens()
    peft_lp = log_probs(wrapped.peft_model, ids)
    assert (peft_lp - log_probs(base, ids)).abs().max() > 1e-2  # the adapter changes the model
    torch.testing.assert_close(log_probs(target, ids), peft_lp, atol=1e-5, rtol=0)
    with wrapped.disabled():  # the reference: adapter off = the base model
        torch.testing.assert_close(log_probs(wrapped.peft_model, ids), log_probs(base, ids), atol=1e-6, rtol=0)


def test_target_modules_list_and_exclude(tiny):
    cfg = dataclasses.replace(
        LORA, target_modules=["q_proj", "v_proj"], exclude_modules=["model.layers.0.self_attn.q_proj"]
    )
    wrapped = wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), cfg)
    adapted = set(wrapped.scalings())
    assert "model.layers.0.self_attn.q_proj" not in adapted
    assert {m.rsplit(".", 1)[1] for m in adapted} == {"q_proj", "v_proj"}
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="matched no linear layer"):
        wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), dataclasses.replace(LORA, target_modules=["nope_proj"]))


def _batch(ids: torch.Tensor, response_length: int):
    mask = torch.ones_like(ids)
    pos = mask.cumsum(1) - 1
    return ids, mask, pos, response_length


@pytest.mark.parametrize("shard", [False, True], ids=["plain", "fsdp2"])
def test_fsdp_lora_reference_optimizer_and_checkpoint(tiny, tmp_path, process_group, shard):
    from rlkit.workers.fsdp_model import FSDPModel, export_hf

    fsdp = FSDPConfig(shard_single_worker=shard)
    model = FSDPModel(str(tiny), fsdp, torch.device("cpu"), lora=LORA, gradient_checkpointing=True)
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=10)
    assert model.lora is not None
    trained = model.trainable_parameters()
    report = model.memory_report()
    assert report["trainable_params"] == sum(p.numel() for p in trained) < 0.2 * report["params"]

    ids = tokens(rows=4, length=10)
    base = AutoModelForCausalLM.from_pretrained(tiny)
    base_lp = log_probs(base, ids)[:, -4:]
    # one optimizer step on a toy loss moves only the adapter
    before = {k: v.clone() for k, v in model.iter_wrapped_params()}
    model.module.train()
    out = model.forward(*_batch(ids, 4), response_logits_only=False)
    (-out.log_probs.mean()).backward()
    model.clip_and_step(1.0)
    after = dict(model.iter_wrapped_params())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert model.memory_report()["optimizer_state_mb"] * 2**20 == pytest.approx(
        2 * 4 * sum(p.numel() for p in trained) + 4 * sum(1 for _ in trained), rel=0.01
    )  # exp_avg(_sq) + step

    model.module.eval()
    with torch.no_grad():
        with model.lora.disabled():
            ref = model.forward(*_batch(ids, 4)).log_probs
        trained_lp = model.forward(*_batch(ids, 4)).log_probs
    torch.testing.assert_close(ref, base_lp, atol=1e-5, rtol=0)
    assert (trained_lp - ref).abs().max() > 1e-4
    merged = AutoModelForCausalLM.from_pretrained(tiny)
    merged.load_state_dict(dict(model.iter_full_params()))
    torch.testing.assert_close(log_probs(merged, ids)[:, -4:], trained_lp, atol=1e-5, rtol=0)

    # checkpoint: adapter + its optimizer state only; a fresh model resumes to the same next step
    ckpt = tmp_path / "actor"
    model.save(ckpt)
    from torch.distributed.checkpoint import FileSystemReader

    saved = [k for k in FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert saved and [k for k in saved if ".lora_" not in k] == []  # no base weights in the checkpoint
    resumed = FSDPModel(str(tiny), fsdp, torch.device("cpu"), lora=LORA)
    resumed.setup_optimizer(OptimConfig(lr=1e-2), total_steps=10)
    resumed.load(ckpt)
    for m in (model, resumed):
        m.module.train()
        (-m.forward(*_batch(ids, 4), response_logits_only=False).log_probs.mean()).backward()
        m.clip_and_step(1.0)
    a, b = dict(model.iter_wrapped_params()), dict(resumed.iter_wrapped_params())
    assert all(torch.equal(a[k], b[k]) for k in a)

    # export: the merged folder is the merged stream; the adapter folder loads with peft onto the base
    model.save(ckpt)  # the stepped state
    merged_dir, adapter_dir = (
        export_hf(ckpt, tmp_path / "merged"),
        export_hf(ckpt, tmp_path / "adapter", adapter_only=True),
    )
    assert (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "adapter_model.safetensors").is_file()
    from peft import PeftModel

    exported = AutoModelForCausalLM.from_pretrained(merged_dir)
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), str(adapter_dir))
    full = dict(model.iter_full_params())
    assert all(torch.allclose(exported.state_dict()[k], full[k], atol=1e-6) for k in full)
    torch.testing.assert_close(log_probs(with_adapter, ids), log_probs(exported, ids), atol=1e-5, rtol=0)


def test_adapter_folder_round_trip(tiny, tmp_path):
    """`save_adapter_folder` writes what peft loads (the native vLLM sync and `export --adapter-only` use it)."""
    from peft import PeftModel

    wrapped = wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), LORA)
    randomize_adapter(wrapped.hf_model, seed=3)
    out = save_adapter_folder(tmp_path / "a", wrapped.config, adapter_state_dict(wrapped.hf_model.state_dict().items()))
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), str(out))
    ids = tokens()
    torch.testing.assert_close(log_probs(loaded, ids), log_probs(wrapped.peft_model, ids), atol=1e-6, rtol=0)


def test_bf16_base_keeps_float32_adapters(tiny, process_group):
    """param_dtype=bfloat16 (the GPU default): the frozen base is stored in bf16 (no float32 copy), the adapter
    and its optimizer state stay float32, the adapter computes on its bf16 copy (one worker: no FSDP2) and one step
    trains the adapter only."""
    from rlkit.workers.fsdp_model import FSDPModel

    model = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16"), torch.device("cpu"), lora=LORA)
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=2)
    assert not model.sharded and model.compute_copy is not None
    dtypes = {n: p.dtype for n, p in model.module.named_parameters()}
    assert {d for n, d in dtypes.items() if ".lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if ".lora_" not in n} == {torch.bfloat16}
    ids = tokens(rows=2, length=8)
    model.module.train()
    (-model.forward(*_batch(ids, 3), response_logits_only=False).log_probs.mean()).backward()
    assert torch.isfinite(torch.tensor(model.clip_and_step(1.0)))
    assert {p.dtype for n, p in model.module.named_parameters() if ".lora_" in n} == {torch.float32}  # masters in place
    states = [v for s in model.optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}
    merged = dict(model.iter_full_params())
    base = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    assert set(merged) == set(base) and merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.model.lora_rank=-1"], "must be >= 0"),
        (
            [
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.rollout.lora_sync=native",
                "actor_rollout_ref.rollout.name=hf",
            ],
            "needs the vllm engine",
        ),
        (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.lora_sync=nope"], "lora_sync='nope'"),
        (
            [
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.rollout.lora_sync=native",
                "trainer.one_step_off_policy=true",
            ],
            "use lora_sync=merge",
        ),
    ],
)
def test_lora_config_errors_name_the_key(overrides, message):
    from rlkit.errors import UserError
    from rlkit.trainer.run.run_config import load_config

    with pytest.raises(UserError, match=message):
        load_config("grpo", overrides)


def test_lora_adapter_path_starts_from_that_adapter(tiny, tmp_path):
    """`lora_adapter_path`: the run starts from an existing PEFT adapter (its config wins), trainable."""
    wrapped = wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), dataclasses.replace(LORA, lora_rank=2))
    randomize_adapter(wrapped.hf_model, seed=5)
    out = save_adapter_folder(
        tmp_path / "start", wrapped.config, adapter_state_dict(wrapped.hf_model.state_dict().items())
    )
    started = wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), ModelConfig(lora_adapter_path=str(out)))
    assert started.config.r == 2 and started.trainable_parameters()
    assert all(".lora_" in n for n, p in started.hf_model.named_parameters() if p.requires_grad)
    ids = tokens()
    torch.testing.assert_close(
        log_probs(started.peft_model, ids), log_probs(wrapped.peft_model, ids), atol=1e-6, rtol=0
    )
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="no adapter_config.json"):
        wrap_lora(AutoModelForCausalLM.from_pretrained(tiny), ModelConfig(lora_adapter_path=str(tmp_path)))


def test_run_summary_lines_show_what_trains_and_the_optimizer_state():
    from rlkit.trainer.run.run_summary import memory_rows

    lora = {"params": 135e6, "trainable_params": 2.44e6, "optimizer_state_mb": 18.6, "grad_mb": 9.3, "lora_rank": 8.0}
    rows = dict(memory_rows(lora))
    assert rows["trainable parameters"] == "2.44M of 135.00M (1.81%, LoRA rank 8)"
    assert rows["optimizer state + grads (all ranks)"] == "18.6 MB + 9.3 MB"
    full = dict(memory_rows({**lora, "trainable_params": 135e6, "lora_rank": 0.0}))
    assert full["trainable parameters"].endswith("(100.00%, full fine-tuning)")
    assert memory_rows(None) == []


@pytest.mark.parametrize("why", ["shard_single_worker", "gradient_checkpointing"])
def test_bf16_lora_under_fsdp2_trains(tiny, process_group, why):
    """bf16 compute with FSDP2 (several workers, offload, or gradient checkpointing in bf16 on one): FSDP2 reduces a
    group's gradients to one dtype, so the frozen base is kept in float32 with the adapters there (a verl LoRA script
    on a bf16 CPU failed its first update with "attempting to assign a gradient with dtype BFloat16 to a tensor with
    grad_dtype Float" when the run's first forward was the reference's, with the adapter off: peft then marks the
    adapters frozen, and FSDP2 reads the dtypes of the trainable parameters once, at that first forward); the
    adapters still train alone and in float32."""
    from rlkit.workers.fsdp_model import FSDPModel

    fsdp = FSDPConfig(param_dtype="bfloat16", shard_single_worker=why == "shard_single_worker")
    model = FSDPModel(str(tiny), fsdp, torch.device("cpu"), lora=LORA,
                      gradient_checkpointing=why == "gradient_checkpointing")
    model.setup_optimizer(OptimConfig(lr=1e-2), total_steps=2)
    assert model.sharded
    before = {k: v.clone() for k, v in model.iter_wrapped_params()}
    with torch.no_grad(), model.lora.disabled():  # the run's first forward: the reference (the base, adapter off)
        model.forward(*_batch(tokens(rows=2, length=8), 3))
    model.module.train()
    (-model.forward(*_batch(tokens(rows=2, length=8), 3), response_logits_only=False).log_probs.mean()).backward()
    assert torch.isfinite(torch.tensor(model.clip_and_step(1.0)))
    after = dict(model.iter_wrapped_params())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
