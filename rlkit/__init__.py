"""rlkit: RL post-training for LLMs (single controller on Ray, FSDP2 workers, vLLM hybrid engine)."""

__version__ = "0.1.0"
