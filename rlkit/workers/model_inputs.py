"""What a model forward reads per row: token ids, mask, positions, and the per-token extras a model family needs.

`ModelInputs` holds the (b, S) `input_ids` / `attention_mask` / `position_ids` of a micro-batch and a dict of
extra per-token inputs (`TokenInput`), each naming the dimensions it is aligned on (rows, tokens): MoE routing
replay's `routed_experts` (b, S, layers, k) today; a vision-language model's 3-D rotary position ids (3, b, S)
would be `TokenInput(ids, row_dim=1, token_dim=2)`. Every way the forward selects tokens treats every extra as
it treats the token ids, in one code path each (`to`, `gather_rows`, `trim_left_padding`, `pack`), so a new
per-token input needs no edit there:

    ModelInputs ──SP: gather_rows (the group's rows)──▶ pack ──▶ PackedInputs (this rank's slice of the row)
                └─padded: trim_left_padding (the columns some row uses)─────────▶ ModelInputs (trimmed)

A vision-language model also reads its images (`images`: the micro-batch's pixel patches and grids, joined in
row order, rlkit/models/vision.py); they are no per-token input, and trimming and packing, which keep every valid
token and the rows' order, keep them as they are; under SP `gather_rows` gathers the group's with its rows.
Qwen2-VL's 3-D rotary positions are a `TokenInput` named `position_ids` (4, b, S) that stands in for the 1-D
ones (`with_images`).

An extra with `to_model` goes to the model's forward under its name; one without (the replayed routes) is handed
to whoever consumes it (`FSDPModel` asks its `RouterTap` for the names it takes), as the model would see it:
(rows, tokens, ...) after packing/slicing or trimming, rows-then-tokens in the model's token order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlkit.models.moe_router import RouterTap
from rlkit.models.vision import batch_images, join_image_batches, model_config, rope_positions, uses_rope_positions
from rlkit.workers.packing import PackedRow, left_padding_start
from rlkit.workers.row_group import RowGroup
from rlkit.workers.ulysses import SequenceParallel


def _pad_left(t: torch.Tensor, columns: int, fill: int | float) -> torch.Tensor:
    """(rows, tokens, ...) with `columns` more leading tokens of `fill` (masked out: padding)."""
    return torch.cat([t.new_full((t.shape[0], columns, *t.shape[2:]), fill), t], dim=1)


@dataclass(frozen=True, eq=False)
class TokenInput:
    """An extra per-token input: `value`'s dims `row_dim` and `token_dim` align with input_ids' (b, S)."""

    value: torch.Tensor
    row_dim: int = 0
    token_dim: int = 1
    fill: int | float = 0  # on the packed row's end padding (a sequence of its own, nothing reads its outputs)
    to_model: bool = True  # a keyword of the model's forward; False: handed to the model's consumer of that name

    def rows_tokens(self) -> torch.Tensor:
        """`value` viewed (rows, tokens, ...)."""
        return self.value.movedim((self.row_dim, self.token_dim), (0, 1))

    def with_rows_tokens(self, value: torch.Tensor) -> TokenInput:
        """The same input with a new (rows, tokens, ...) value, laid out as this one."""
        return replace(self, value=value.movedim((0, 1), (self.row_dim, self.token_dim)))


def replayed_routes(routed_experts: torch.Tensor) -> TokenInput:
    """MoE routing replay's extra: (b, S, layers, k) expert ids for the router tap (-1 = the router's own)."""
    return TokenInput(routed_experts.long(), fill=RouterTap.OWN_CHOICE, to_model=False)


@dataclass(frozen=True, eq=False)
class ModelInputs:
    input_ids: torch.Tensor  # (b, S)
    attention_mask: torch.Tensor  # (b, S)
    position_ids: torch.Tensor  # (b, S)
    extras: dict[str, TokenInput] = field(default_factory=dict)
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # model keywords: pixel_values, image_grid_thw

    @classmethod
    def of(
        cls,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        routed_experts: torch.Tensor | None = None,
    ) -> ModelInputs:
        """From tensors; `routed_experts` (b, S, layers, k): MoE routing replay's routes, None = the routers' own."""
        extras = {} if routed_experts is None else {RouterTap.INPUT: replayed_routes(routed_experts)}
        return cls(input_ids, attention_mask, position_ids, extras)

    def with_extra(self, name: str, extra: TokenInput) -> ModelInputs:
        """These inputs with one more per-token input."""
        return replace(self, extras={**self.extras, name: extra})

    def with_images(self, module: torch.nn.Module, rows: list | None) -> ModelInputs:
        """These inputs with the rows' images (`multi_modal_inputs`, one per row, {} for none) and, for a model
        with 3-D rotary positions, those positions computed from the full rows (before any trimming/packing)."""
        images = batch_images(rows, model_config(module))
        extras = dict(self.extras)
        if uses_rope_positions(module):
            positions = rope_positions(module, self.input_ids, self.attention_mask, self.position_ids, images)
            extras["position_ids"] = TokenInput(positions, row_dim=1, token_dim=2)
        return replace(self, extras=extras, images=images)

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelInputs:
        """`fn` on every per-token tensor viewed (rows, tokens, ...), the extras laid out back as they were."""
        extras = {name: x.with_rows_tokens(fn(x.rows_tokens())) for name, x in self.extras.items()}
        return ModelInputs(fn(self.input_ids), fn(self.attention_mask), fn(self.position_ids), extras, self.images)

    def to(self, device: torch.device) -> ModelInputs:
        moved = self._map(lambda t: t.to(device))
        return replace(moved, images={k: v.to(device) for k, v in self.images.items()})

    def trim_left_padding(self, response_length: int, bucket: int = 1) -> ModelInputs:
        """Without the leading columns that are padding in every row (rlkit/workers/packing.py), keeping (or
        adding) as many as make the width a multiple of `bucket` (rlkit/workers/shape_buckets.py; tensor
        parallel's sequence split needs it exact)."""
        first = left_padding_start(self.attention_mask, response_length)
        first -= -(self.attention_mask.shape[1] - first) % bucket
        if first >= 0:
            return self._map(lambda t: t[:, first:])
        add = -first
        extras = {name: x.with_rows_tokens(_pad_left(x.rows_tokens(), add, x.fill)) for name, x in self.extras.items()}
        ids, mask, positions = (_pad_left(t, add, 0) for t in (self.input_ids, self.attention_mask, self.position_ids))
        return ModelInputs(ids, mask, positions, extras, self.images)

    def gather_rows(self, sp: RowGroup, vision_config: Any = None) -> tuple[ModelInputs, slice]:
        """The group's (Ulysses or tensor-parallel) micro-batches stacked in rank order, and this rank's rows in
        them. A vision-language model (`vision_config`: its HF config) also gets the group's images joined in that
        order, the order of their image tokens in the packed row (a collective: every rank of the group, with
        images or not)."""
        names = list(self.extras)
        tensors = [self.input_ids, self.attention_mask, self.position_ids]
        tensors += [self.extras[name].rows_tokens() for name in names]
        gathered, own = sp.gather_rows(*tensors)
        extras = {name: self.extras[name].with_rows_tokens(t) for name, t in zip(names, gathered[3:], strict=True)}
        return ModelInputs(*gathered[:3], extras, self._gather_images(sp, vision_config)), own

    def _gather_images(self, sp: RowGroup, vision_config: Any) -> dict[str, torch.Tensor]:
        if vision_config is None:
            if self.images:
                raise ValueError("images given to a model without a vision tower")
            return {}
        parts = sp.gather_objects({k: v.cpu() for k, v in self.images.items()})
        device = self.input_ids.device
        return {k: v.to(device) for k, v in join_image_batches(parts, vision_config).items()}

    def pack(self, sp: SequenceParallel | None, bucket: int = 1) -> PackedInputs:
        """The valid tokens in one row (padded to a multiple of the SP size and of `bucket`,
        rlkit/workers/shape_buckets.py), and this rank's slice of it."""
        multiple = math.lcm(sp.size if sp else 1, bucket)
        row = PackedRow.pack(self.input_ids, self.attention_mask, self.position_ids, multiple_of=multiple)
        lo, hi = sp.slice(row.length) if sp else (0, row.length)
        extras = {
            name: x.with_rows_tokens(row.pack_tokens(x.rows_tokens(), x.fill)[lo:hi].unsqueeze(0))
            for name, x in self.extras.items()
        }
        return PackedInputs(row, lo, hi, sp, row.input_ids[:, lo:hi], row.position_ids[:, lo:hi], extras)


@dataclass(frozen=True, eq=False)
class PackedInputs:
    """A packed row (rlkit/workers/packing.py) and what of it this rank feeds the model: [lo, hi) (all without SP)."""

    row: PackedRow
    lo: int
    hi: int
    sp: SequenceParallel | None
    input_ids: torch.Tensor  # (1, hi - lo)
    position_ids: torch.Tensor  # (1, hi - lo)
    extras: dict[str, TokenInput]  # (rows 1, tokens hi - lo, ...) in each one's layout

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """(hi - lo, ...) per local position -> (Tp, ...) for the whole row."""
        return self.sp.gather(local) if self.sp is not None else local

    def gather_kept(self, local: torch.Tensor, at: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Values at this slice's positions `at` (of the row's `kept`, those in the slice) -> values at all `kept`."""
        if self.sp is None:
            return local
        return self.sp.gather(local.new_zeros(self.hi - self.lo).index_put((at,), local))[kept]
