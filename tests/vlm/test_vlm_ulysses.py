"""Ulysses sequence parallelism with images: a tiny Qwen2.5-VL under SP=2 computes what SP=1 computes on the same
2 gloo workers (tests/workers/test_ulysses.py ties SP=1 there to the text model's SP=2 and to 1 worker).

Each rank holds its own micro-batch of rows with 0, 1 and 2 images; the group's images follow their rows into the
packed row, whose image tokens fall into both ranks' slices. Cases: images on both ranks, images on rank 0 only
(rank 1's micro-batch has none, yet joins the gather), and no image in the group. Checked (float32): the log-probs
(1e-5 absolute), and every parameter's gradient after FSDP's reduce (1e-4 of the global norm elementwise, as
tests/workers/test_ulysses.py), the vision tower's included and nonzero: each rank runs the tower on the whole
row, its slice's embeddings get its loss's gradient, and the reduce sums them to the SP=1 gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.gloo_workers import gloo_rank, run_on_gloo_workers

CASES = {  # rows of rank 0, rows of rank 1 (indices into test_vlm_forward's PROMPTS: 0, 1, 2 images)
    "images-on-both": ([0, 2, 1], [1, 0]),
    "images-on-rank-0": ([2, 1], [0, 0]),
    "no-images": ([0], [0, 0]),
}


def micro_batch(model, rows: list, pick: list[int], pad_id: int, advantages: torch.Tensor):
    """ModelInputs of the picked rows (the same columns for any pick), their response mask and advantages."""
    from rlkit.data.collation import left_pad
    from rlkit.workers.model_inputs import ModelInputs

    prompt_len, resp_len = max(len(r[0]) for r in rows) + 2, max(len(r[1]) for r in rows) + 1
    chosen = [rows[i] for i in pick]
    p_ids, p_mask, p_pos = left_pad([r[0] for r in chosen], prompt_len, pad_id)
    responses = torch.full((len(chosen), resp_len), pad_id)
    r_mask = torch.zeros_like(responses)
    for i, (_, resp, _) in enumerate(chosen):
        responses[i, : len(resp)] = torch.tensor(resp)
        r_mask[i, : len(resp)] = 1
    pos = torch.cat([p_pos, p_pos[:, -1:] + torch.arange(1, resp_len + 1)], 1)
    inputs = ModelInputs.of(torch.cat([p_ids, responses], 1), torch.cat([p_mask, r_mask], 1), pos)
    inputs = inputs.with_images(model.module, [r[2] for r in chosen])
    return inputs, r_mask, advantages.unsqueeze(1).expand(-1, resp_len), resp_len


def step(model, inputs, mask, advantages, resp_len):
    """Forward, this rank's loss weighted as the update loop weighs it, backward; log-probs and local gradients."""
    from rlkit.algo.loss_agg import agg_loss
    from rlkit.workers.micro_batch import loss_scales

    model.module.zero_grad(set_to_none=True)
    out = model.forward(inputs, response_length=resp_len, temperature=0.7)
    scale = loss_scales([mask], "token-mean")[0]
    (scale * agg_loss(-advantages * out.log_probs, mask.float())).backward()
    grads = {  # this rank's shard; zeros where no gradient arrived (no image in the batch: the vision tower's)
        n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).detach().clone()
        if p.grad is not None else torch.zeros(0)
        for n, p in model.module.named_parameters()
    }
    return out.log_probs.detach(), grads


def _worker(rank: int, store_path: str, path: str, results) -> None:
    from transformers import AutoImageProcessor, AutoTokenizer

    from rlkit.config.schema import FSDPConfig
    from rlkit.models.vision import VISION_TOWERS
    from rlkit.workers.fsdp_model import FSDPModel
    from tests.vlm.test_vlm_forward import rows_of

    with gloo_rank(rank, store_path, results):
        tokenizer = AutoTokenizer.from_pretrained(path)
        rows = rows_of(tokenizer, AutoImageProcessor.from_pretrained(path))
        cpu = torch.device("cpu")
        dp = FSDPModel(path, FSDPConfig(), cpu)
        sp = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2)
        assert sp.sp is not None and dp.sp is None
        for case, picks in CASES.items():
            union = picks[0] + picks[1]
            advantages = torch.randn(len(union), generator=torch.Generator().manual_seed(0))
            own = slice(0, len(picks[0])) if rank == 0 else slice(len(picks[0]), len(union))
            lp1, g1 = step(dp, *micro_batch(dp, rows, union, tokenizer.pad_token_id, advantages))
            batch = micro_batch(sp, rows, picks[rank], tokenizer.pad_token_id, advantages[own])
            lp2, g2 = step(sp, *batch)
            mask = batch[1].bool()
            diff = float((lp1[own] - lp2)[mask].abs().max())
            assert diff <= 1e-5, f"{case}: log-prob diff {diff:.2e}"
            sq = torch.tensor(sum(float((g**2).sum()) for g in g1.values()))
            dist.all_reduce(sq)
            norm = float(sq.sqrt())
            vision = torch.tensor(sum(float((g**2).sum()) for n, g in g1.items()
                                      if any(f".{t}." in f".{n}" for t in VISION_TOWERS)))
            dist.all_reduce(vision)
            assert norm > 0 and (float(vision) > 0) == (case != "no-images"), f"{case}: vision grad {float(vision)}"
            for name, g in g1.items():
                assert g.numel() == g2[name].numel(), f"{case} {name}: a gradient under one SP size only"
                gd = float((g2[name] - g).abs().max()) if g.numel() else 0.0
                assert gd <= 1e-4 * norm, f"{case} {name}: |grad diff| {gd:.2e} vs norm {norm:.2e}"


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    from rlkit.testing import save_tiny_vlm

    return str(save_tiny_vlm(tmp_path_factory.mktemp("vlm-sp") / "tiny"))


@pytest.mark.slow
def test_sp2_with_images_matches_sp1_on_two_gloo_workers(vlm_path, tmp_path):
    run_on_gloo_workers(_worker, vlm_path, tmp_path)
