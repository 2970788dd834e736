"""Measure the agent loop: samples in flight, batch sizes, and model tokens/s with and without tools.

    python bench/agent_loop.py --model tiny --samples 16
    python bench/agent_loop.py --model ~/.cache/rlkit/models/smollm2-135m-instruct-*/ --backend hf

Modes (same prompts, same response budget):
  plain        one-shot `backend.generate` (no agent loop) on the dataset prompts: the baseline
  plain_tool_prompt  the same on the prompts the agent loop sends (tool schemas included)
  loop         the agent loop with the calculator offered; the model's own turns decide
  calculator   the first turn of every sample is a planned calculator call, then the model continues
  python       the same with a planned `python` call (a sandboxed subprocess per call)
Planned calls make every sample use a tool, which a small model would not do by itself.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlkit.rollout.agent.engine import TurnOutput, TurnRequest


class PlannedFirstTurn:
    """Engine wrapper: turn 0 of every sample returns `planned` (ids ending with EOS); later turns go through."""

    def __init__(self, server: Any, planned: list[int]) -> None:
        self.server, self.planned = server, planned
        self.stop_ids, self.stats = server.stop_ids, server.stats

    def session(self):
        return self.server.session()

    async def aclose(self) -> None:
        await self.server.aclose()

    async def generate(self, req: TurnRequest) -> TurnOutput:
        if req.turn == 0:
            return TurnOutput(list(self.planned), [0.0] * len(self.planned), stopped=True)
        return await self.server.generate(req)


def _prompts(tokenizer: Any, n: int, width: int):
    from rlkit.data.collation import collate

    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"what is {i} + {i} * 2 ?"}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        rows.append({"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"], "raw_prompt": msgs})
    return collate(rows, width, tokenizer.pad_token_id)


def run(model: str, backend_name: str, samples: int, response_length: int, prompt_length: int,
        repeats: int = 3, report: Any = None) -> list[dict]:
    """One result row per mode; `report(row)` is called as each mode finishes."""
    report = report or (lambda row: None)
    import rlkit.rollout.agent_rollout as ar
    from rlkit.models.loading import load_tokenizer
    from rlkit.rollout import ROLLOUT_BACKENDS, RolloutConfig

    if model == "tiny":
        import tempfile

        from rlkit.testing import save_tiny_model

        path = save_tiny_model(Path(tempfile.mkdtemp(prefix="rlkit-bench-")) / "tiny", heads=2)
        model = str(path)
    tok = load_tokenizer(model)
    cfg = RolloutConfig(name=backend_name, prompt_length=prompt_length, response_length=response_length,
                        kv_cache_memory_mb=256, max_num_seqs=max(samples, 1),
                        multi_turn={"enable": True, "tools": ["calculator", "python"], "max_turns": 3})
    engine = ROLLOUT_BACKENDS.get(backend_name)(model, cfg)
    agent = ar.AgentRollout(engine, tok, cfg)
    prompts = _prompts(tok, samples, prompt_length)
    sampling = cfg.to_sampling()
    calls = {
        "calculator": '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7 + 3"}}</tool_call>',
        "python": '<tool_call>{"name": "python", "arguments": {"code": "print(sum(range(100)))"}}</tool_call>',
    }
    if model.endswith("tiny") or "tiny" in Path(model).name:  # word-level vocabulary: spell the calls with spaces
        calls = {"calculator": '<tool_call> { " name " : " calculator " , " arguments " : { " expression " : '
                               '" 2 * 7 + 3 " } } </tool_call>'}  # digits are single tokens
    results = []
    # The baseline runs on a helper thread too, as the batching server's calls do.
    pool = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))
    pool.submit(engine.generate, prompts, sampling).result()  # warm-up (first-call costs of the kernels)
    walls, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        out = pool.submit(engine.generate, prompts, sampling).result()
        walls.append(time.perf_counter() - start)
        tokens = int(out["response_mask"].sum())
    wall = sorted(walls)[len(walls) // 2]
    results.append({"mode": "plain", "wall_s": wall, "model_tokens": tokens, "tokens_per_s": tokens / wall,
                    "in_flight_max": samples, "batch_size_mean": samples})
    report(results[-1])
    # the same one-shot generate on the prompts the agent loop sends (tool schemas included): loop overhead
    from rlkit.rollout.agent.engine import left_pad

    with_tools = left_pad([agent.renderer.prompt_ids(m) for m in prompts["raw_prompt"]], tok.pad_token_id)
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = pool.submit(engine.generate, with_tools, sampling).result()
        walls.append(time.perf_counter() - start)
        tokens = int(out["response_mask"].sum())
    pool.shutdown()
    wall = sorted(walls)[len(walls) // 2]
    results.append({"mode": "plain_tool_prompt", "wall_s": wall, "model_tokens": tokens,
                    "tokens_per_s": tokens / wall, "in_flight_max": samples, "batch_size_mean": samples})
    report(results[-1])
    modes: list[tuple[str, str | None]] = [("loop", None), *[(name, text) for name, text in calls.items()]]
    real_loop = ar.AgentLoop
    for mode, call in modes:
        if call is not None:
            planned = tok(call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ar.AgentLoop = lambda server, *a, _p=planned, **k: real_loop(PlannedFirstTurn(server, _p), *a, **k)
        walls = []
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                out = agent.generate(prompts, sampling)
                walls.append(time.perf_counter() - start)
        finally:
            ar.AgentLoop = real_loop
        wall = sorted(walls)[len(walls) // 2]  # the median run (its metrics are those of the last run)
        m = out.meta["metrics"]
        planned_tokens = len(planned) * samples if call is not None else 0
        tokens = int(out["response_mask"].sum()) - planned_tokens  # count only tokens the model generated
        results.append({
            "mode": mode, "wall_s": wall, "model_tokens": tokens, "tokens_per_s": tokens / wall,
            "in_flight_max": m["agent/in_flight/max"], "batch_size_mean": m["agent/batch_size/mean"],
            "gen_calls": m["agent/gen_calls"], "num_turns_mean": m["num_turns/mean"],
            "tool_calls_mean": m["tool_calls/mean"], "tool_errors": m["tool_errors/sum"],
            "tool_s_total": m["timing_s/agent_tools"],
        })  # fmt: skip
        report(results[-1])
    close = getattr(engine, "close", None)
    if close is not None:
        close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model folder, or 'tiny' for the random test Llama")
    parser.add_argument("--backend", default="hf", help="a registered rollout backend (ROLLOUT_BACKENDS)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the median wall time is reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (on a shared, loaded CPU, 1 is often much faster)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    def report(row: dict) -> None:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    run(args.model, args.backend, args.samples, args.response_length, args.prompt_length, args.repeats, report)


if __name__ == "__main__":
    main()
