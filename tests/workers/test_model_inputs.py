"""`ModelInputs`: every per-token extra is trimmed, gathered, packed and sliced as the token ids are, whatever
dimensions it is aligned on; `FSDPModel.forward` takes one (the same outputs as from the tensors), hands model-
keyword extras to the model and the others to their consumer, and refuses an extra that nothing consumes."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from rlkit.workers.model_inputs import ModelInputs, TokenInput
from rlkit.workers.ulysses import SequenceParallel
from tests.perf.test_forward_equivalence import RESPONSE, handmade_batch


def with_extras(batch: dict) -> ModelInputs:
    """The batch's rows, plus two extras derived from the position ids: (3, b, S) (a VLM's 3-D rotary positions'
    layout) and (b, S, 2), so each packed/trimmed extra can be checked against the positions."""
    pos = batch["position_ids"]
    extras = {
        "rope3d": TokenInput(torch.stack([pos, pos + 100, pos + 200]), row_dim=1, token_dim=2, fill=-7),
        "pairs": TokenInput(torch.stack([pos, -pos], dim=-1), fill=-1, to_model=False),
    }
    return ModelInputs(batch["input_ids"], batch["attention_mask"], pos, extras)


def test_trimming_cuts_every_extra_like_the_ids():
    inputs = with_extras({k: v[1:4] for k, v in handmade_batch(0).items()})  # prompts of 3, 7, 5 tokens
    trimmed = inputs.trim_left_padding(RESPONSE)
    width = trimmed.input_ids.shape[1]
    assert width < inputs.input_ids.shape[1]  # rows 1-3 have short prompts: leading columns go
    pos = trimmed.position_ids
    assert torch.equal(trimmed.extras["rope3d"].value, torch.stack([pos, pos + 100, pos + 200]))
    assert torch.equal(trimmed.extras["pairs"].value, torch.stack([pos, -pos], dim=-1))



def test_a_width_that_falls_short_of_the_bucket_gets_padding_columns_in_front():
    """Tensor parallel's sequence split needs the fed width a multiple of its size: trimming adds masked columns
    when the rows have too few padding columns to keep, every extra padded with its own fill."""
    inputs = with_extras(handmade_batch(0))
    full = inputs.input_ids.shape[1]
    first = int(inputs.attention_mask.bool().any(0).int().argmax())
    bucket = full - first + 3 if first < 3 else full + 3  # more than the padding columns there are
    out = inputs.trim_left_padding(RESPONSE, bucket)
    width = out.input_ids.shape[1]
    assert width % bucket == 0 and width > full
    added = width - full
    assert torch.equal(out.input_ids[:, added:], inputs.input_ids)
    assert not out.attention_mask[:, :added].any() and torch.equal(out.attention_mask[:, added:], inputs.attention_mask)
    assert (out.extras["rope3d"].value[:, :, :added] == -7).all() and (out.extras["pairs"].value[:, :added] == -1).all()
    assert torch.equal(out.extras["pairs"].value[:, added:], inputs.extras["pairs"].value)

@pytest.mark.parametrize("rank", [0, 3])
def test_packing_and_the_sp_slice_select_every_extra_like_the_ids(rank):
    batch = handmade_batch(0)
    inputs = with_extras(batch)
    packed = inputs.pack(SequenceParallel(size=4, rank=rank, group=None))
    tokens = int(batch["attention_mask"].sum())
    pad = packed.row.length - tokens
    assert packed.row.length % 4 == 0 and pad > 0  # the row needs end padding here
    lo, hi = packed.lo, packed.hi
    pos = batch["position_ids"][batch["attention_mask"].bool()]
    rope = torch.cat([torch.stack([pos, pos + 100, pos + 200]), torch.full((3, pad), -7)], dim=1)
    assert torch.equal(packed.extras["rope3d"].value, rope[:, None, lo:hi])
    pairs = torch.cat([torch.stack([pos, -pos], dim=-1), torch.full((pad, 2), -1)])
    assert torch.equal(packed.extras["pairs"].value, pairs[None, lo:hi])
    assert torch.equal(packed.position_ids[0, : max(0, tokens - lo)], pos[lo:hi])


class _TwoCopies:
    """A stand-in SP group of two ranks holding the same micro-batch (gather = the rows twice)."""

    def gather_rows(self, *tensors):
        return [torch.cat([t, t]) for t in tensors], slice(0, tensors[0].shape[0])


def test_gathering_rows_stacks_every_extra_on_its_row_dim():
    inputs = with_extras(handmade_batch(0))
    gathered, own = inputs.gather_rows(_TwoCopies())
    pos = gathered.position_ids
    assert pos.shape[0] == 12 and own == slice(0, 6)
    assert torch.equal(gathered.extras["rope3d"].value, torch.stack([pos, pos + 100, pos + 200]))
    assert torch.equal(gathered.extras["pairs"].value, torch.stack([pos, -pos], dim=-1))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_forward_takes_model_inputs_and_routes_each_extra(model_path, remove_padding):
    from rlkit.workers.fsdp_model import FSDPModel

    batch = handmade_batch(0)
    model = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"))
    seen: dict[str, torch.Tensor] = {}

    def take_extra(module, args, kwargs):  # what the model's forward got; the tiny Llama has no such keyword
        seen["ids"], seen["rope3d"] = kwargs["input_ids"], kwargs.pop("rope3d", None)
        return args, kwargs

    model.module.register_forward_pre_hook(take_extra, with_kwargs=True)
    taken: list[torch.Tensor] = []
    model._input_consumers = {"pairs": taken.append}
    args = [batch[k] for k in ("input_ids", "attention_mask", "position_ids")]
    with torch.no_grad():
        ref = model.forward(*args, RESPONSE, with_entropy=True, remove_padding=remove_padding)
        got = model.forward(with_extras(batch), response_length=RESPONSE, with_entropy=True,
                            remove_padding=remove_padding)
    assert torch.equal(ref.log_probs, got.log_probs) and torch.equal(ref.entropy, got.entropy)
    ids = seen["ids"]
    assert seen["rope3d"].shape == (3, *ids.shape)  # the model keyword, selected as the ids were
    assert len(taken) == 1 and taken[0].shape == (*ids.shape, 2)  # the consumer's, likewise
    model._input_consumers = {}
    with pytest.raises(ValueError, match="pairs given to a model that has nothing consuming it"):
        model.forward(with_extras(batch), response_length=RESPONSE, remove_padding=remove_padding)
