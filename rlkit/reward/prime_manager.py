"""The `prime` reward manager (verl's PrimeRewardManager) on rlkit's parallel scoring.

verl's `prime` scores the samples in a pool of `num_processes` processes (default 64), each with a
300 s timeout, a failed or timed-out sample scoring 0. rlkit's `rule` manager already scores in
parallel with a per-sample timeout, so `prime` is that manager with `reward_model.reward_kwargs.num_processes`
(verl's option) as its number of workers. What differs from verl's:
- workers are threads, not processes: a scorer that holds the GIL (pure-Python loops) does not run in
  parallel with the others, and a timed-out one is abandoned, not killed;
- the timeout is `reward_model.timeout_s` (verl: a fixed 300 s);
- the number of workers defaults to `reward_model.num_workers` (verl: 64);
- a dict result keeps its extra keys as `reward_extra/<name>` (verl keeps only the score), and a custom
  function failing on every sample of a batch stops the run (verl: all zeros);
- a custom function is called as `rule` calls it (rlkit.reward.custom: by verl's parameter names, else
  positionally as fn(response, ground_truth, extra_info)); verl's prime calls it positionally as
  fn(data_source, solution_str, ground_truth, extra_info).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.reward.manager import RewardManager, config_kwargs
from rlkit.reward.registry import REWARD_MANAGERS

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    """verl's `prime` manager: per-sample scores on `num_processes` parallel workers, each with a timeout."""

    @classmethod
    def from_config(cls, cfg: RLConfig, tokenizer: Any, *, num_processes: int | None = None) -> PrimeRewardManager:
        cls.check_config(cfg, num_processes=num_processes)
        kwargs = config_kwargs(cfg)
        if num_processes is not None:
            kwargs["num_workers"] = num_processes
        return cls(tokenizer, **kwargs)

    @staticmethod
    def check_config(cfg: RLConfig, *, num_processes: int | None = None) -> None:
        if num_processes is not None and (not isinstance(num_processes, int) or isinstance(num_processes, bool)
                                          or num_processes < 1):
            raise UserError(f"reward_model.reward_kwargs.num_processes={num_processes!r} must be a whole number >= 1")
