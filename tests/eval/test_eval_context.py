"""`rlkit eval` fits prompt + response into the model's context (vLLM refuses an engine that does
not fit, with a 120-line validation error), and keeps third-party noise out of the console."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from rlkit.errors import UserError
from rlkit.eval.evaluator import fit_context
from rlkit.models.context import context_length
from tests.trainer.conftest import cli_env, rlkit_cmd

NOISE = [r"Triton", r"FutureWarning", r"NUMA binding", r"Loading safetensors checkpoint shards", r"LD_PRELOAD",
         r"\b(INFO|WARNING) \d\d-\d\d \d\d:"]


def test_context_length_from_the_config_files(tmp_path):
    def folder(config: dict, tokenizer: dict | None = None):
        path = tmp_path / str(len(list(tmp_path.iterdir())))
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        if tokenizer is not None:
            (path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
        return path

    assert context_length(folder({"max_position_embeddings": 256})) == 256
    assert context_length(folder({"n_positions": 1024, "max_position_embeddings": 2048})) == 1024  # the smallest
    assert context_length(folder({"text_config": {"max_position_embeddings": 4096}})) == 4096  # multimodal wrapper
    assert context_length(folder({"max_position_embeddings": 4096,
                                  "rope_scaling": {"type": "linear", "factor": 4.0}})) == 16384
    assert context_length(folder({"max_position_embeddings": 131072,
                                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})) == 131072  # pre-scaled
    assert context_length(folder({"max_position_embeddings": 4096}, {"model_max_length": 2048})) == 2048
    assert context_length(folder({"max_position_embeddings": 4096}, {"model_max_length": 1e30})) == 4096
    assert context_length(folder({"hidden_size": 8})) is None


def test_fit_context_caps_the_response_or_names_the_option(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 256}')
    notes: list[str] = []
    assert fit_context(str(tmp_path), 64, 100, notes.append) == (64, 100) and notes == []
    assert fit_context(str(tmp_path), 512, 200, notes.append, longest=40) == (40, 200) and notes == []  # prompts fit
    assert fit_context(str(tmp_path), 64, 512, notes.append, longest=100) == (64, 192)
    assert notes == [f"--max-response-length 512 capped to 192: the model holds 256 tokens (max_position_embeddings "
                     f"in {tmp_path}/config.json) and prompts take up to 64"]
    with pytest.raises(UserError, match=r"prompts take up to 300 tokens \(--max-prompt-length 512\) and leave no room "
                                        r"for a response: the model holds 256 tokens .*lower --max-prompt-length .*"
                                        r"e.g. --max-prompt-length 128"):
        fit_context(str(tmp_path), 512, 512, notes.append, longest=300)


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("eval_ctx")
    model = save_tiny_model(root / "model", heads=2, tie_embeddings=True)  # 256 positions; head_dim 32 for vLLM
    proc = subprocess.run(rlkit_cmd("data", "toy", "--out", str(root / "toy"), "--length", "1", "--test-size", "4"),
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return model, root / "toy" / "test.parquet"


def _eval(model, data, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(rlkit_cmd("eval", str(model), "--data", str(data), "--limit", "2", "--out", str(out), *extra),
                          capture_output=True, text=True, env={**cli_env(), **(env or {})}, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_vllm_eval_with_default_lengths_on_a_short_context_model(tmp_path, model_and_data):
    """512 + 512 tokens on a 256-token model: prompts are padded only as far as they need, the response is
    capped with one note, and the run works (vLLM itself would refuse the engine)."""
    model, data = model_and_data
    proc = _eval(model, data, tmp_path / "gen.jsonl", "--backend", "vllm")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    note = re.search(r"note: --max-response-length 512 capped to (\d+): the model holds 256 tokens",
                     " ".join(out.split()))
    assert note, out[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["response_length"] <= int(note.group(1)) for r in rows)
    for pattern in NOISE:  # hidden unless RLKIT_VERBOSE=1
        assert not re.search(pattern, out), f"{pattern!r} in the output:\n{out[-4000:]}"

    proc = _eval(model, data, tmp_path / "gen.jsonl", "--backend", "vllm", "--max-prompt-length", "64",
                 env={"RLKIT_VERBOSE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    shown = [p for p in NOISE if re.search(p, out)]
    assert len(shown) >= 3, f"RLKIT_VERBOSE=1 shows the third-party lines; seen {shown}:\n{out[-3000:]}"


def test_prompts_that_fill_the_context_are_one_error(tmp_path, model_and_data):
    model, _ = model_and_data
    long = tmp_path / "long"  # 400 digits to copy: prompts of ~800 tokens, over the model's 256
    made = subprocess.run(rlkit_cmd("data", "toy", "--out", str(long), "--length", "400", "--test-size", "2"),
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    assert made.returncode == 0, made.stderr
    proc = _eval(model, long / "test.parquet", tmp_path / "gen.jsonl", "--backend", "vllm",
                 "--max-prompt-length", "1024")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "ValidationError" not in proc.stderr
    assert re.match(r"error: prompts take up to \d+ tokens \(--max-prompt-length 1024\) and leave no room for a "
                    r"response: the model holds 256 tokens", proc.stderr.strip().splitlines()[-1]), proc.stderr
