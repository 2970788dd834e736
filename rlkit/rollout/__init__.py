"""Rollout backends (token-in/token-out generation) and their registry.

Importing this package registers every backend in `ROLLOUT_BACKENDS`; none of
them imports vLLM until an engine is built.
"""

from rlkit.config.rollout import RolloutConfig, ValKwargs
from rlkit.rollout.base import ROLLOUT_BACKENDS, RolloutBackend, SamplingConfig, assemble_output
from rlkit.rollout.hf_rollout import HFRollout
from rlkit.rollout.vllm_rollout import VLLMRollout, default_backend_name, prepare_vllm_env


def tensor_parallel_backends() -> list[str]:
    """The registered backends that can split one engine over several workers (`tensor_parallel`)."""
    return [name for name in ROLLOUT_BACKENDS.names() if ROLLOUT_BACKENDS.get(name).tensor_parallel]


def route_returning_backends() -> list[str]:
    """The registered backends that return each token's MoE routing (`returns_routed_experts`)."""
    return [name for name in ROLLOUT_BACKENDS.names() if ROLLOUT_BACKENDS.get(name).returns_routed_experts]


__all__ = [
    "ROLLOUT_BACKENDS",
    "HFRollout",
    "RolloutBackend",
    "RolloutConfig",
    "SamplingConfig",
    "VLLMRollout",
    "ValKwargs",
    "assemble_output",
    "default_backend_name",
    "prepare_vllm_env",
    "route_returning_backends",
    "tensor_parallel_backends",
]
