"""The `dapo` reward manager (verl's DAPORewardManager): the `rule` manager's score plus DAPO's overlong penalty.

    reward_model.reward_manager=dapo
    reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 512, penalty_factor: 1.0, log: false}
    reward_model.reward_kwargs.max_resp_len=${data.max_response_length}

score = the sample's score (scorer by data_source, or custom_reward_function) + penalty, where
penalty = min(-(length - (max_resp_len - len)) / len * penalty_factor, 0) (rlkit.reward.overlong, the same
implementation `reward_model.overlong_buffer` shapes with). As in verl the penalty is part of the score:
validation scores and dynamic sampling see it, and `log: true` adds `reward_extra/overlong_reward` and
`reward_extra/overlong`. Turn on one of the two overlong keys, not both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.manager import RewardManager, config_kwargs
from rlkit.reward.overlong import OverlongBuffer
from rlkit.reward.placement import on_last_token
from rlkit.reward.registry import REWARD_MANAGERS

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

KEY = "reward_model.reward_kwargs.overlong_buffer_cfg"


@REWARD_MANAGERS.register("dapo")
class DapoRewardManager(RewardManager):
    """verl's `dapo` manager: per-sample scores (as `rule`) with the overlong penalty added."""

    def __init__(self, tokenizer: Any, *, overlong: OverlongBuffer, max_resp_len: int | None, **kwargs: Any) -> None:
        super().__init__(tokenizer, **kwargs)
        self.overlong = overlong
        self.max_resp_len = max_resp_len

    @classmethod
    def from_config(cls, cfg: RLConfig, tokenizer: Any, *, max_resp_len: int | None = None,
                    overlong_buffer_cfg: Mapping[str, Any] | None = None) -> DapoRewardManager:
        overlong = cls.check_config(cfg, max_resp_len=max_resp_len, overlong_buffer_cfg=overlong_buffer_cfg)
        return cls(tokenizer, overlong=overlong, max_resp_len=max_resp_len, **config_kwargs(cfg))

    @staticmethod
    def check_config(cfg: RLConfig, *, max_resp_len: int | None = None,
                     overlong_buffer_cfg: Mapping[str, Any] | None = None) -> OverlongBuffer:
        overlong = OverlongBuffer.parse(overlong_buffer_cfg, KEY)
        if not overlong.enable:
            return overlong
        if max_resp_len is None:
            raise UserError(f"{KEY}.enable needs reward_model.reward_kwargs.max_resp_len, the length the penalty "
                            "ramps up to, e.g. reward_model.reward_kwargs.max_resp_len=${data.max_response_length}")
        if OverlongBuffer.parse(cfg.reward_model.overlong_buffer, "reward_model.overlong_buffer").enable:
            raise UserError(f"{KEY} and reward_model.overlong_buffer are both on: the penalty would count twice; "
                            "set reward_model.overlong_buffer.enable=false")
        overlong.check_length(int(max_resp_len), KEY)
        return overlong

    def compute(self, batch: Batch) -> Batch:
        out = super().compute(batch)
        if not self.overlong.enable:
            return out
        mask = batch["response_mask"] if "response_mask" in batch else batch["responses"] != self.tokenizer.pad_token_id
        penalty = self.overlong.penalty(mask, int(self.max_resp_len))  # type: ignore[arg-type]
        out["token_level_scores"] = out["token_level_scores"] + on_last_token(penalty, mask)
        for key, column in self.overlong.extras(penalty).items():
            out[key] = column
        out.meta[METRICS_KEY]["reward/overlong_penalty/mean"] = [float(penalty.mean())] if len(batch) else [0.0]
        return out
