"""The agent loop: one coroutine per sample, turns of generate -> parse -> tools -> append.

Per sample (see `AgentLoop.run_sample`):

1. generate from the context until a stop token (EOS, or `</tool_call>` with
   `stop_at_tool_end`) or the remaining response budget;
2. parse the turn's tool calls; run the first `max_parallel_calls` of them
   concurrently (at most `max_parallel_tools` calls in flight over all samples),
   each failure becoming an error message;
3. append the results rendered by the chat template (role "tool"), or, without
   tool calls, ask the simulated user (`Interaction`) if one is configured;
4. stop when a turn has no tool call (and no user reply), after
   `max_assistant_turns` model turns or `max_user_turns` tool/user turns, or when
   the response budget is spent (an observation that does not fit with room for
   one more token is dropped).

The output has the rollout layout of `rlkit/rollout/base.py`; responses
interleave model and tool/user tokens, `response_mask` is 1 exactly on the
model's tokens and `attention_mask` is 1 on all of them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlkit.config.agent import MultiTurnConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.rollout.agent.chat import ChatRenderer
from rlkit.rollout.agent.engine import AsyncEngine, TurnRequest
from rlkit.rollout.agent.interaction import Interaction
from rlkit.rollout.agent.parser import ToolCall, ToolParser
from rlkit.rollout.agent.tools import Tool, ToolResult, release_tool, run_tool
from rlkit.rollout.base import assemble_output
from rlkit.utils.async_run import run_coroutine
from rlkit.utils.once import Once
from rlkit.utils.tokens import pad_token_id

logger = logging.getLogger(__name__)
_logged = Once()


def _log_once(message: str) -> None:
    if _logged.first(message):
        logger.warning(message)


@dataclass
class Sample:
    """What one conversation starts from."""

    index: int
    prompt_ids: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = model token
    log_probs: list[float] = field(default_factory=list)
    num_turns: int = 0
    tool_calls: int = 0
    tool_calls_skipped: int = 0  # calls past max_parallel_calls in their turn (not run)
    tool_errors: int = 0
    finish: str = "stop"  # stop | max_turns | length
    interaction_reward: float = 0.0
    interaction_errors: int = 0
    tool_release_errors: int = 0
    prefix_breaks: int = 0  # external agent: requests that rewrote the history (the trajectory ends before)
    external_errors: int = 0  # external agent: episodes whose agent raised
    messages: list[dict[str, Any]] = field(default_factory=list)

    def add(self, ids: Sequence[int], model: bool, log_probs: Sequence[float] | None = None) -> None:
        self.response_ids += list(ids)
        self.mask += [int(model)] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)


def _as_dict(value: Any, what: str) -> dict[str, Any]:
    """A dataset column value (dict, JSON string or None) as a dict."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise UserError(f"{what} must be a dict or a JSON object string, got {value[:80]!r}") from None
    if not isinstance(value, Mapping):
        raise UserError(f"{what} must be a dict (tool name -> kwargs), got {type(value).__name__}")
    return {k: v for k, v in value.items() if v is not None}


VERL_TOOL_KWARGS = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


def _row_value(prompts: Batch, key: str, row: int) -> Any:
    """Row `row`'s `key` column, else its `extra_info[key]` (where verl's datasets keep tools_kwargs and
    interaction_kwargs), else None."""
    column = prompts.non_tensors.get(key)
    if column is not None and column[row] is not None:
        return column[row]
    extra = prompts.non_tensors.get("extra_info")
    info = extra[row] if extra is not None else None
    return info.get(key) if isinstance(info, Mapping) else None


def _call_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A tool's per-row kwargs: verl's layout (`{create_kwargs: {..}, execute_kwargs: {..}}`) merged into one
    dict, since an rlkit tool has one `call`; rlkit's flat layout as it is."""
    if not kwargs or any(k not in VERL_TOOL_KWARGS for k in kwargs):
        return kwargs
    return {**(kwargs.get("create_kwargs") or {}), **(kwargs.get("execute_kwargs") or {})}


class AgentLoop:
    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Any,
        config: MultiTurnConfig,
        tools: Mapping[str, Tool],
        parser: ToolParser,
        renderer: ChatRenderer | None = None,
        interaction: Interaction | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.tools, self.parser, self.interaction = dict(tools), parser, interaction
        schemas = [t.schema() for t in self.tools.values()]
        self.renderer = renderer or ChatRenderer(tokenizer, schemas, parser.instructions(schemas) if schemas else None)
        eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = eos if isinstance(eos, (list, tuple)) else [eos]
        end_id = parser.end_token_id(tokenizer)
        self.turn_end_ids = {int(i) for i in [*eos_ids, *getattr(engine, "stop_ids", [])] if i is not None} - {end_id}
        self._tool_sem: asyncio.Semaphore | None = None
        self.tool_seconds = 0.0

    # ------------------------------------------------------------ one sample
    async def run_sample(self, sample: Sample, response_length: int) -> Trajectory:
        traj = Trajectory(list(sample.prompt_ids), messages=[dict(m) for m in sample.messages])
        episode: dict[str, Tool] = {}  # this episode's instances of the tools it called (stateful: its own)
        try:
            await self._run_turns(sample, response_length, traj, episode)
        finally:
            for name, tool in episode.items():
                if tool.stateful:
                    error = await release_tool(tool)
                    if error is not None:
                        traj.tool_release_errors += 1
                        _log_once(f"tool '{name}': release() failed ({error}); counted in tool_release_errors/sum")
        return traj

    async def _run_turns(self, sample: Sample, response_length: int, traj: Trajectory,
                         episode: dict[str, Tool]) -> None:
        cfg = self.config
        user_turns = 0  # tool-result and simulated-user turns appended (verl's user turns)
        async with self.engine.session():
            for turn in itertools.count():
                budget = response_length - len(traj.response_ids)
                if budget <= 0:
                    traj.finish = "length"
                    break
                out = await self.engine.generate(
                    TurnRequest(traj.prompt_ids + traj.response_ids, budget, sample.index, turn)
                )
                traj.add(out.token_ids, True, out.log_probs)
                traj.num_turns += 1
                parsed = self.parser.parse(self.tokenizer.decode(out.token_ids, skip_special_tokens=False))
                content = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
                traj.messages.append({"role": "assistant", "content": content})
                traj.tool_calls += len(parsed.calls)
                if not out.stopped:
                    traj.finish = "length"
                    break
                last_turn = _reached(cfg.max_assistant_turns, turn + 1) or _reached(cfg.max_user_turns, user_turns)
                if parsed.calls:
                    if last_turn:
                        traj.finish = "max_turns"
                        break
                    calls = parsed.calls[: cfg.max_parallel_calls]
                    traj.tool_calls_skipped += len(parsed.calls) - len(calls)
                    results = await self._run_calls(calls, sample.tools_kwargs, episode)
                    traj.tool_errors += sum(not r.ok for r in results)
                    new = [
                        {"role": "tool", "name": c.name or "error", "content": self._clip(r.text)}
                        for c, r in zip(calls, results)
                    ]
                elif self.interaction is not None:
                    replies = sum(1 for m in traj.messages[len(sample.messages):] if m["role"] == "user")
                    try:
                        reply = await self.interaction.respond(
                            traj.messages, replies=replies, **sample.interaction_kwargs
                        )
                    except Exception as exc:  # a broken simulated user ends the episode, never the rollout
                        traj.interaction_errors += 1
                        _log_once(f"interaction '{type(self.interaction).__name__}' failed ({type(exc).__name__}: "
                                  f"{exc}); the episode ends there (counted in interaction/errors/sum)")
                        traj.finish = "stop"
                        break
                    traj.interaction_reward += float(reply.reward or 0.0)
                    if reply.message is None:
                        traj.finish = "stop"
                        break
                    if last_turn:
                        traj.finish = "max_turns"
                        break
                    new = [{"role": "user", "content": reply.message}]
                else:
                    traj.finish = "stop"
                    break
                last = out.token_ids[-1] if out.token_ids else None
                last_text = self.tokenizer.decode([last]) if last in self.turn_end_ids else ""
                delta = self.renderer.append_ids(new, last_text)
                if len(delta) >= response_length - len(traj.response_ids):
                    traj.finish = "length"
                    break
                traj.add(delta, False)
                traj.messages.extend(new)
                user_turns += 1

    def _clip(self, text: str) -> str:
        return truncate_text(text, self.config.max_tool_response_length, self.config.tool_response_truncate_side)

    async def _run_calls(self, calls: list[ToolCall], tools_kwargs: Mapping[str, Any],
                         episode: dict[str, Tool]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self._run_call(c, tools_kwargs, episode) for c in calls)))

    async def _run_call(self, call: ToolCall, tools_kwargs: Mapping[str, Any], episode: dict[str, Tool]) -> ToolResult:
        if call.error is not None:
            return ToolResult(f"Error: {call.error}", "parse_error")
        if call.name not in self.tools:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"Error: unknown tool '{call.name}'; available tools: {known}", "unknown_tool")
        if call.name not in episode:
            try:
                episode[call.name] = self.tools[call.name].episode()
            except Exception as exc:  # a tool that cannot start its episode is an error result, like a failed call
                return ToolResult(f"Error: '{call.name}' could not start: {type(exc).__name__}: {exc}", "exception")
        tool = episode[call.name]
        assert self._tool_sem is not None
        async with self._tool_sem:
            start = time.perf_counter()
            try:
                return await run_tool(tool, call.arguments, tools_kwargs.get(call.name), self.config.tool_timeout_s)
            finally:
                self.tool_seconds += time.perf_counter() - start

    # ------------------------------------------------------------ the batch
    async def run_all(self, samples: Sequence[Sample], response_length: int) -> list[Trajectory]:
        self._tool_sem = asyncio.Semaphore(self.config.max_parallel_tools)
        try:
            if self.config.external_agent:
                return await self._run_external(samples, response_length)
            return list(await asyncio.gather(*(self.run_sample(s, response_length) for s in samples)))
        finally:
            close = getattr(self.engine, "aclose", None)
            if close is not None:
                await close()

    async def _run_external(self, samples: Sequence[Sample], response_length: int) -> list[Trajectory]:
        """Each sample's episode run by the external agent against the OpenAI endpoint (openai_endpoint.py)."""
        import rlkit.rollout.agent.external_agents  # noqa: F401  (registers the built-in agents)
        from rlkit.rollout.agent.openai_endpoint import EXTERNAL_AGENTS, OpenAIEndpoint

        if any(not s.messages for s in samples):
            raise UserError("multi_turn.external_agent needs each row's prompt as chat messages (the dataset's "
                            "`prompt`/raw_prompt column); this batch has rows without them")
        agent = EXTERNAL_AGENTS.get(self.config.external_agent)
        endpoint = OpenAIEndpoint(self.engine, self.tokenizer, self.parser, response_length,
                                  template_kwargs=self.renderer.template_kwargs)
        await endpoint.start()

        async def episode(sample: Sample) -> Trajectory:
            errors = 0
            async with self.engine.session():
                try:
                    await agent(endpoint.base_url(sample.index), [dict(m) for m in sample.messages], self.tools,
                                **self.config.external_agent_config)
                except Exception as exc:  # the agent's bug ends its episode, never the rollout
                    errors = 1
                    _log_once(f"external agent '{self.config.external_agent}' failed ({type(exc).__name__}: {exc}); "
                              "its episode keeps the turns made so far (counted in agent/external_errors/sum)")
            log = endpoint.episodes.get(sample.index)
            if log is None or not log.prompt_ids:  # the agent never asked the endpoint
                return Trajectory(list(sample.prompt_ids), external_errors=errors)
            return Trajectory(log.prompt_ids, log.response_ids, log.mask, log.log_probs, log.num_turns,
                              log.tool_calls, finish=log.finish, messages=log.messages,
                              prefix_breaks=log.prefix_breaks, external_errors=errors)

        try:
            return list(await asyncio.gather(*(episode(s) for s in samples)))
        finally:
            await endpoint.close()

    def samples_from(self, prompts: Batch) -> list[Sample]:
        """Samples from a rollout input batch; with `raw_prompt` the prompt is re-rendered with the tools."""
        ids, attn = prompts["input_ids"], prompts["attention_mask"].bool()
        raw = prompts.non_tensors.get("raw_prompt")
        rm = prompts.non_tensors.get("reward_model")
        samples = []
        for i in range(len(prompts)):
            messages = [dict(m) for m in raw[i]] if raw is not None and raw[i] is not None else []
            prompt_ids = self.renderer.prompt_ids(messages) if messages else ids[i][attn[i]].tolist()
            interaction_kwargs = _as_dict(_row_value(prompts, "interaction_kwargs", i), "interaction_kwargs")
            if rm is not None and isinstance(rm[i], Mapping) and "ground_truth" in rm[i]:
                interaction_kwargs.setdefault("ground_truth", rm[i]["ground_truth"])
            tools_kwargs = _as_dict(_row_value(prompts, "tools_kwargs", i), "tools_kwargs")
            samples.append(Sample(
                i, prompt_ids, messages,
                {k: _call_kwargs(_as_dict(v, f"tools_kwargs['{k}']")) for k, v in tools_kwargs.items()},
                interaction_kwargs,
            ))  # fmt: skip
        return samples

    def generate(self, prompts: Batch, response_length: int, calculate_log_probs: bool = False) -> Batch:
        """Run every sample of `prompts` to the end; the rollout Batch plus agent metrics in meta."""
        samples = self.samples_from(prompts)
        _check_prompt_width(samples, prompts["input_ids"].shape[1])
        start = time.perf_counter()
        self.tool_seconds = 0.0
        trajs = run_coroutine(self.run_all(samples, response_length))
        out = assemble(prompts, trajs, response_length, pad_token_id(self.tokenizer), calculate_log_probs)
        out.meta.setdefault("metrics", {})
        out.meta["metrics"] = {**out.meta["metrics"], **agent_metrics(trajs),
                               "timing_s/agent_loop": time.perf_counter() - start,
                               "timing_s/agent_tools": self.tool_seconds}
        stats = getattr(self.engine, "stats", None)
        if stats is not None:
            out.meta["metrics"].update(stats.metrics())
        return out


def _reached(limit: int | None, count: int) -> bool:
    return limit is not None and count >= limit


def truncate_text(text: str, limit: int, side: str) -> str:
    """A tool output cut to `limit` characters plus a marker: `left` keeps the head, `right` the tail,
    `middle` half of each."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[len(text) - limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]


def _check_prompt_width(items: Sequence[Sample] | Sequence[Trajectory], width: int) -> None:
    longest = max((len(t.prompt_ids) for t in items), default=0)
    if longest > width:
        raise UserError(
            f"multi-turn: a prompt rendered with the tool schemas has {longest} tokens, more than the "
            f"{width} of data.max_prompt_length; raise data.max_prompt_length"
        )


def assemble(
    prompts: Batch, trajs: Sequence[Trajectory], response_length: int, pad_id: int, with_log_probs: bool
) -> Batch:
    """Trajectories -> the rollout Batch (prompts left-padded to the input width, responses right-padded)."""
    rows, width = len(trajs), prompts["input_ids"].shape[1]
    _check_prompt_width(trajs, width)
    prompt_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, width), dtype=torch.long)
    responses = torch.full((rows, response_length), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((rows, response_length), dtype=torch.long)
    resp_attn = torch.zeros((rows, response_length), dtype=torch.long)
    log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n, p = min(len(t.response_ids), response_length), len(t.prompt_ids)
        if p:
            prompt_ids[i, width - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
            prompt_mask[i, width - p:] = 1
        if n:
            responses[i, :n] = torch.tensor(t.response_ids[:n], dtype=torch.long)
            resp_mask[i, :n] = torch.tensor(t.mask[:n], dtype=torch.long)
            resp_attn[i, :n] = 1
            log_probs[i, :n] = torch.tensor(t.log_probs[:n], dtype=torch.float32) * resp_mask[i, :n]
    prompt_pos = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
    non_tensors = dict(prompts.non_tensors)
    non_tensors.update({
        "agent/num_turns": np.array([t.num_turns for t in trajs], dtype=object),
        "agent/tool_calls": np.array([t.tool_calls for t in trajs], dtype=object),
        "agent/tool_errors": np.array([t.tool_errors for t in trajs], dtype=object),
        "agent/finish": np.array([t.finish for t in trajs], dtype=object),
        "agent/interaction_reward": np.array([t.interaction_reward for t in trajs], dtype=object),
    })  # fmt: skip
    rebuilt = Batch({"input_ids": prompt_ids, "attention_mask": prompt_mask, "position_ids": prompt_pos},
                    non_tensors, prompts.meta)
    return assemble_output(rebuilt, responses, resp_mask, log_probs if with_log_probs else None,
                           response_attention=resp_attn)


def agent_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """num_turns/mean|max, tool_calls/mean|max, tool_errors/sum, finish shares, interaction reward."""
    if not trajs:
        return {}
    turns = [t.num_turns for t in trajs]
    calls = [t.tool_calls for t in trajs]
    out = {
        "num_turns/mean": float(np.mean(turns)),
        "num_turns/max": float(max(turns)),
        "num_turns/min": float(min(turns)),
        "tool_calls/mean": float(np.mean(calls)),
        "tool_calls/max": float(max(calls)),
        "tool_errors/sum": float(sum(t.tool_errors for t in trajs)),
        "tool_calls_skipped/sum": float(sum(t.tool_calls_skipped for t in trajs)),
        "interaction/reward/mean": float(np.mean([t.interaction_reward for t in trajs])),
        "interaction/errors/sum": float(sum(t.interaction_errors for t in trajs)),
        "tool_release_errors/sum": float(sum(t.tool_release_errors for t in trajs)),
    }
    if any(t.prefix_breaks or t.external_errors for t in trajs):
        out["agent/prefix_breaks/sum"] = float(sum(t.prefix_breaks for t in trajs))
        out["agent/external_errors/sum"] = float(sum(t.external_errors for t in trajs))
    for reason in ("stop", "max_turns", "length"):
        out[f"agent/finish_{reason}/frac"] = float(np.mean([t.finish == reason for t in trajs]))
    return out
