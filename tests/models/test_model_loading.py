"""resolve_model_path on folders, GGUF files and bad input; GGUF conversion fidelity and cache reuse."""

from __future__ import annotations

import shutil
import time

import pytest
import torch

from rlkit.errors import UserError
from rlkit.models.loading import (
    MARKER,
    cached_models,
    convert_gguf,
    load_causal_lm,
    load_tokenizer,
)
from rlkit.models.resolve import resolve_model, resolve_model_path
from tests.models.tiny_gguf import write_tiny_gguf


def test_local_folder_resolves_to_itself(tiny_hf_folder, cache_dir):
    assert resolve_model_path(str(tiny_hf_folder), cache_dir) == tiny_hf_folder
    assert resolve_model(tiny_hf_folder, cache_dir).source == "local folder"


def test_folder_without_config_names_the_path(tmp_path, cache_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty has no config.json"):
        resolve_model_path(str(tmp_path / "empty"), cache_dir)


def test_folder_without_weights_names_the_path(tmp_path, cache_dir):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"cfg has config.json but no weights"):
        resolve_model_path(str(tmp_path / "cfg"), cache_dir)


def test_corrupt_config_json(tmp_path, cache_dir):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match=r"config.json line 1 column 2: not valid JSON .*download or copy it again"):
        resolve_model_path(str(tmp_path / "bad"), cache_dir)


def test_missing_path_and_unknown_name(tmp_path, cache_dir):
    with pytest.raises(UserError, match=r"no such file or folder"):
        resolve_model_path(str(tmp_path / "nope.gguf"), cache_dir)
    with pytest.raises(UserError, match=r"Did you mean alias 'smollm2-135m-instruct'"):
        resolve_model_path("smollm2-135m-instuct", cache_dir)


def test_non_gguf_file_is_rejected(tmp_path, cache_dir):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UserError, match=r"weights.bin is a file but not a .gguf"):
        resolve_model_path(str(tmp_path / "weights.bin"), cache_dir)


def test_corrupt_gguf_names_the_path(tmp_path, cache_dir, tiny_gguf):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(UserError, match=r"bad.gguf is not a GGUF file"):
        resolve_model_path(str(bad), cache_dir)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf[0].read_bytes()[:5000])
    with pytest.raises(UserError, match=r"truncated.gguf"):
        resolve_model_path(str(truncated), cache_dir)
    assert cached_models(cache_dir) == []  # nothing half-written was published
    assert not [p for p in cache_dir.iterdir() if ".tmp-" in p.name]


def test_hub_id_unreachable_says_what_to_do(cache_dir):
    with pytest.raises(UserError, match=r"org/model.*unreachable.*rlkit model pull org/model"):
        resolve_model_path("org/model", cache_dir)


def test_hub_id_offline_flag(cache_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"offline mode is set"):
        resolve_model_path("org/model", cache_dir)


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_conversion_matches_original_weights(tmp_path, cache_dir, tied):
    gguf = tmp_path / "m.gguf"
    original = write_tiny_gguf(gguf, tied=tied)
    folder = convert_gguf(gguf, cache_dir, dtype="float32").path
    converted = load_causal_lm(folder, dtype="float32")
    assert converted.config.tie_word_embeddings == tied
    assert getattr(converted.config, "quantization_config", None) is None
    ref = original.state_dict()
    for name, tensor in converted.state_dict().items():
        torch.testing.assert_close(tensor, ref[name], rtol=0, atol=0, msg=name)
    ids = torch.tensor([[5, 70, 90, 259, 2]])
    torch.testing.assert_close(converted(ids).logits, original(ids).logits)


def test_gguf_conversion_dequantizes(tmp_path, cache_dir):
    gguf = tmp_path / "q.gguf"
    original = write_tiny_gguf(gguf, quantize_ffn=True)
    converted = load_causal_lm(convert_gguf(gguf, cache_dir, dtype="float32").path)
    up = "model.layers.0.mlp.up_proj.weight"
    torch.testing.assert_close(converted.state_dict()[up], original.state_dict()[up], rtol=0, atol=2e-3)


def test_gguf_tokenizer_and_chat_template(tiny_gguf, cache_dir):
    folder = resolve_model_path(str(tiny_gguf[0]), cache_dir)
    tok = load_tokenizer(folder)
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>"
    ids = tok.encode("hello the<|im_end|>")
    assert ids[-1] == tok.eos_token_id and tok.decode(ids) == "hello the<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (folder / "generation_config.json").is_file()


def test_second_resolve_reuses_cache(tiny_gguf, cache_dir):
    first = resolve_model(str(tiny_gguf[0]), cache_dir)
    weights = first.path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    second = resolve_model(str(tiny_gguf[0]), cache_dir)
    assert time.perf_counter() - start < 0.5
    assert second.path == first.path and second.source == "gguf (cached)"
    assert weights.stat().st_mtime_ns == mtime
    assert (first.path / MARKER).is_file()
    [cached] = cached_models(cache_dir)
    assert cached.path == first.path and cached.size_bytes > 0


def test_cache_key_is_content_not_location(tiny_gguf, cache_dir, tmp_path):
    moved = tmp_path / "elsewhere.gguf"
    shutil.copy(tiny_gguf[0], moved)
    a = convert_gguf(tiny_gguf[0], cache_dir, name="same")
    b = convert_gguf(moved, cache_dir, name="same")
    assert a.path == b.path and b.source == "gguf (cached)"
    assert convert_gguf(moved, cache_dir, name="same", dtype="float32").path != a.path


def test_load_tokenizer_falls_back_to_eos(tmp_path):
    from rlkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no pad token"):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == loaded.eos_token


def test_load_causal_lm_dtype(tiny_hf_folder):
    assert load_causal_lm(tiny_hf_folder, dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(UserError, match="unknown dtype"):
        load_causal_lm(tiny_hf_folder, dtype="float8")
