"""Chat-template rendering for the agent loop, token-in/token-out.

The model's own tokens are never re-tokenised. What the loop appends after a
model turn (tool results, a simulated user's message, the next assistant
header) is the *difference* between two renderings of the same conversation,
with and without the new messages, around a placeholder assistant turn:

    base = [user "hi", assistant PLACEHOLDER]            -> "... PLACEHOLDER<|im_end|>\\n"
    full = base + [tool "42"] + generation prompt        -> "... PLACEHOLDER<|im_end|>\\n<|im_start|>tool\\n42..."
    delta = rest of the assistant turn end + full[len(base):]

"Rest of the turn end" is what the template writes after an assistant message
(`<|im_end|>\\n` above) minus the stop token the model already generated, so a
turn that stopped on EOS gets `\\n` and one cut at `</tool_call>` gets `<|im_end|>\\n`.

Templates that ignore `tools=` (no tool support) get the tool schemas and the
call format in a system message instead (`ToolParser.instructions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlkit.errors import UserError

PLACEHOLDER = "RLKITPLACEHOLDERTURN"
_PROBE_USER = {"role": "user", "content": "hello"}


class ChatRenderer:
    def __init__(
        self,
        tokenizer: Any,
        tool_schemas: Sequence[Mapping[str, Any]] | None = None,
        tool_instructions: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tool_schemas = [dict(s) for s in tool_schemas or []] or None
        self.template_kwargs = dict(template_kwargs or {})
        self.tool_instructions = tool_instructions
        self.native_tools = self.tool_schemas is not None and self._template_uses_tools()
        base = [_PROBE_USER, {"role": "assistant", "content": PLACEHOLDER}]
        self._base_text = self.render(base, add_generation_prompt=False)
        cut = self._base_text.rfind(PLACEHOLDER)
        if cut < 0:
            raise UserError("the chat template drops assistant content; multi-turn rollouts need a chat template "
                            "that renders assistant messages")
        self.turn_end = self._base_text[cut + len(PLACEHOLDER):]
        self._check_append_only()

    # ------------------------------------------------------------- rendering
    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, tools: Any = None) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tools=tools, add_generation_prompt=add_generation_prompt,
            tokenize=False, **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _template_uses_tools(self) -> bool:
        with_tools = self.render([_PROBE_USER], True, tools=self.tool_schemas)
        return with_tools != self.render([_PROBE_USER], True)

    def _check_append_only(self) -> None:
        probe = [{"role": "tool", "name": "probe", "content": "1"}]
        full = self.render([_PROBE_USER, {"role": "assistant", "content": PLACEHOLDER}, *probe], True)
        if not full.startswith(self._base_text):
            raise UserError("the chat template rewrites earlier turns when a tool message follows; multi-turn "
                            "rollouts need an append-only template (pass data chat_template / use another model)")

    # ------------------------------------------------------------ public API
    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages with the tool instructions merged into the system message (non-native templates)."""
        messages = [dict(m) for m in messages]
        if self.tool_schemas is None or self.native_tools or not self.tool_instructions:
            return messages
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0].get('content') or ''}\n\n{self.tool_instructions}".strip()
            return messages
        return [{"role": "system", "content": self.tool_instructions}, *messages]

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt with the tools announced (natively through `tools=`, else in the system message)."""
        tools = self.tool_schemas if self.native_tools else None
        return self.encode(self.render(self.prompt_messages(messages), True, tools=tools))

    def append_ids(self, new_messages: Sequence[Mapping[str, Any]], last_model_token_text: str = "") -> list[int]:
        """Tokens that follow a model turn: the rest of its turn end, the new messages, the assistant header.

        `last_model_token_text` is the decoded last token of the model turn (its stop token, e.g.
        `<|im_end|>`); the part of the turn end up to and including it is already in the context.
        """
        return self.encode(self.append_text(new_messages, last_model_token_text))

    def append_text(self, new_messages: Sequence[Mapping[str, Any]], last_model_token_text: str = "") -> str:
        """The text `append_ids` tokenises."""
        base = [_PROBE_USER, {"role": "assistant", "content": PLACEHOLDER}]
        full = self.render([*base, *[dict(m) for m in new_messages]], True)
        suffix = full[len(self._base_text):]
        rest = self.turn_end
        token = last_model_token_text.strip()
        if token and token in rest:
            rest = rest[rest.index(token) + len(token):]
        return rest + suffix
