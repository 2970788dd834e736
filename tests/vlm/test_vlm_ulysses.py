"""Ulysses sequence parallelism with images: a tiny Qwen2.5-VL and a tiny Idefics3 under SP=2 compute what SP=1
computes on the same 2 gloo workers.

Each rank holds its own micro-batch of rows with 0, 1 and 2 images; under SP the group's images follow their
rows into the packed row, whose image tokens fall into both ranks' slices. Cases: images on both ranks, images
on rank 0 only (rank 1's micro-batch has none, yet joins the gather), and no image in the group. The SP=1
reference: both ranks run the group's whole union of rows with its token-mean loss (loss weight 1), whose
FSDP-averaged gradient is that of the SP ranks' weighted losses (and a rank without images under plain data
parallelism does not run the vision tower's FSDP units, so it could not be the reference). Checked (float32):
the log-probs of each rank's rows (1e-5 absolute), and every parameter's gradient after FSDP's reduce (1e-4 of
the global norm elementwise, as tests/workers/test_ulysses.py), the vision tower's included and nonzero when
there are images: each rank runs the tower on the whole row, its slice's embeddings get its loss's gradient,
and the reduce sums them to the SP=1 gradient. Wall time: 8 s (6 s call, 2 s setup) at load 1.5 on 2 cores.
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
    from rlkit.workers.model_inputs import ModelInputs
    from tests.vlm.batches import padded_batch

    input_ids, mask, pos, r_mask = padded_batch(rows, pad_id, pick)
    resp_len = r_mask.shape[1]
    inputs = ModelInputs.of(input_ids, mask, pos).with_images(model.module, [rows[i][2] for i in pick])
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


def qwen_rows(path: str) -> tuple[list, int]:
    from transformers import AutoImageProcessor, AutoTokenizer

    from tests.vlm.test_vlm_forward import rows_of

    tokenizer = AutoTokenizer.from_pretrained(path)
    return rows_of(tokenizer, AutoImageProcessor.from_pretrained(path)), tokenizer.pad_token_id


def idefics3_rows(path: str) -> tuple[list, int]:
    from tests.vlm.test_idefics3 import idefics3_rows as rows

    return rows(path)


ROWS = {"qwen2_5_vl": qwen_rows, "idefics3": idefics3_rows}


def _worker(rank: int, store_path: str, paths: dict[str, str], results) -> None:
    from rlkit.config.schema import FSDPConfig
    from rlkit.models.vision import VISION_TOWERS
    from rlkit.workers.fsdp_model import FSDPModel

    with gloo_rank(rank, store_path, results):
        for family, path in paths.items():
            rows, pad_id = ROWS[family](path)
            check_family(rank, family, path, rows, pad_id, FSDPModel, FSDPConfig, VISION_TOWERS)


def check_family(rank, family, path, rows, pad_id, FSDPModel, FSDPConfig, VISION_TOWERS) -> None:  # noqa: N803
    cpu = torch.device("cpu")
    dp = FSDPModel(path, FSDPConfig(), cpu)
    sp = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2)
    assert sp.sp is not None and dp.sp is None
    for case, picks in CASES.items():
        case = f"{family}/{case}"
        union = picks[0] + picks[1]
        advantages = torch.randn(len(union), generator=torch.Generator().manual_seed(0))
        own = slice(0, len(picks[0])) if rank == 0 else slice(len(picks[0]), len(union))
        lp1, g1 = step(dp, *micro_batch(dp, rows, union, pad_id, advantages))
        batch = micro_batch(sp, rows, picks[rank], pad_id, advantages[own])
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
        assert norm > 0 and (float(vision) > 0) == ("no-images" not in case), f"{case}: vision grad {float(vision)}"
        for name, g in g1.items():
            assert g.numel() == g2[name].numel(), f"{case} {name}: a gradient under one SP size only"
            gd = float((g2[name] - g).abs().max()) if g.numel() else 0.0
            assert gd <= 1e-4 * norm, f"{case} {name}: |grad diff| {gd:.2e} vs norm {norm:.2e}"


@pytest.fixture(scope="module")
def vlm_paths(tmp_path_factory):
    from rlkit.testing import save_tiny_idefics3, save_tiny_vlm

    root = tmp_path_factory.mktemp("vlm-sp")
    return {"qwen2_5_vl": str(save_tiny_vlm(root / "qwen")), "idefics3": str(save_tiny_idefics3(root / "idefics3"))}


@pytest.mark.slow
def test_sp2_with_images_matches_sp1_on_two_gloo_workers(vlm_paths, tmp_path):
    run_on_gloo_workers(_worker, vlm_paths, tmp_path)
