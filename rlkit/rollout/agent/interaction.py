"""Simulated users for multi-turn dialogues: after a model turn without tool calls, an
`Interaction` may answer with the next user message (the conversation goes on) and a reward.

Selected by `multi_turn.interaction`; per-sample kwargs come from the dataset's
`interaction_kwargs` column, and `ground_truth` from `reward_model.ground_truth`.
The rewards of a conversation are summed into the non-tensor `agent/interaction_reward`
(and the metric `interaction/reward/mean`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.registry import Registry


@dataclass
class UserTurn:
    message: str | None = None  # the next user message; None ends the conversation
    reward: float | None = None


class Interaction:
    name: str = ""

    def __init__(self, **config: Any) -> None:
        self.config = config

    async def respond(self, messages: list[dict[str, Any]], replies: int = 0, **kwargs: Any) -> UserTurn:
        """`messages`: the conversation so far (decoded); `replies`: user messages this interaction already sent;
        kwargs: `ground_truth` and the row's `interaction_kwargs`."""
        raise NotImplementedError  # pragma: no cover


INTERACTIONS: Registry[type[Interaction]] = Registry("interaction")


@INTERACTIONS.register("fixed_reply")
class FixedReply(Interaction):
    """Answers every turn without a tool call with the same `message`, up to `max_replies` times
    (a minimal simulated user: "keep going"; also what the tests use to force multi-turn episodes)."""

    name = "fixed_reply"

    def __init__(self, message: str = "Please continue.", max_replies: int = 1) -> None:
        super().__init__(message=message, max_replies=max_replies)
        self.message, self.max_replies = message, max_replies

    async def respond(self, messages: list[dict[str, Any]], replies: int = 0, **_: Any) -> UserTurn:
        return UserTurn(self.message if replies < self.max_replies else None)


@INTERACTIONS.register("gsm8k_retry")
class GSM8KRetry(Interaction):
    """Checks the last answer (`#### N`) against the ground truth; a wrong one gets "try again"
    (up to `max_retries` times; None: until the answer is right or a turn limit ends the episode).
    Reward: 1 for a correct answer, 0 otherwise, on each check."""

    name = "gsm8k_retry"

    def __init__(self, max_retries: int | None = 1, method: str = "flexible") -> None:
        super().__init__(max_retries=max_retries, method=method)
        self.max_retries, self.method = max_retries, method

    async def respond(
        self, messages: list[dict[str, Any]], replies: int = 0, ground_truth: Any = None, **_: Any
    ) -> UserTurn:
        from rlkit.reward.gsm8k import gsm8k_score

        answer = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
        correct = ground_truth is not None and gsm8k_score(answer, ground_truth, method=self.method)["acc"] == 1.0
        if correct or (self.max_retries is not None and replies >= self.max_retries):
            return UserTurn(None, float(correct))
        return UserTurn("That is not correct. Check your work and give the final answer after ####.", 0.0)
