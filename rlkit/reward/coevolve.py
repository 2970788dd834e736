"""Coder / unit-tester co-evolution (CURE-style): the pass matrix and both roles' rewards.

One policy plays two roles on the same problems, in the same batch (rows made by
`rlkit data code --coevolve`): coder rows write a program, tester rows write one
unit test (an `assert`). Per problem the driver runs every program against every
test in the sandbox and scores (formulas and a worked example: docs/agents.md):

* programs i = 1..k (coder samples), reference tests r, generated tests j = 1..m;
* R[i, t] = program i passes reference test t; A[i, j] = program i passes generated test j;
* coder reward c_i = mean_t R[i, t]  (no reference tests: mean_j A[i, j]);
* program i is correct when it passes every reference test; the reference
  solution, when the data has one, is a known-correct program (used for tests only);
* tester reward ("gated", default): a test must pass every correct program (valid);
  a valid test then earns the share of incorrect programs it fails
  (1 when there is no incorrect program to catch), an invalid one earns 0;
  "balanced": 1/2 (share of correct programs passed) + 1/2 (share of incorrect failed).

The math is in pure functions (`coder_rewards`, `tester_rewards`, ...);
`CoevolveReward` is the batch-level stage, registered as the reward manager
`coevolve` (`reward_model.reward_manager=coevolve`, see recipes/coevolve_code.yaml):
it receives the whole batch, so both roles of a problem are scored together.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.registry import Registry
from rlkit.reward.code import extract_code, load_tests
from rlkit.reward.placement import decode_responses, on_last_token
from rlkit.reward.registry import REWARD_MANAGERS
from rlkit.sandbox import JudgeLimits, judge

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

TESTER_SOURCE = "rlkit/code_tester"
CODER_SOURCE = "rlkit/code"
_ASSERT = re.compile(r"^\s*assert\b", re.MULTILINE)

# ---------------------------------------------------------------------------------------------- reward math


def coder_rewards(ref_pass: np.ndarray, gen_pass: np.ndarray) -> np.ndarray:
    """(k,) pass rate of each program on the reference tests, or on the generated ones when there are none.

    ref_pass: (k, r) bool, gen_pass: (k, m) bool. No tests at all: zeros.
    """
    ref_pass, gen_pass = np.asarray(ref_pass, bool), np.asarray(gen_pass, bool)
    if ref_pass.shape[1]:
        return ref_pass.mean(axis=1)
    if gen_pass.shape[1]:
        return gen_pass.mean(axis=1)
    return np.zeros(ref_pass.shape[0])


def correct_programs(ref_pass: np.ndarray) -> np.ndarray:
    """(k,) a program is correct when it passes every reference test (unknown -> False when there are none)."""
    ref_pass = np.asarray(ref_pass, bool)
    return ref_pass.all(axis=1) if ref_pass.shape[1] else np.zeros(ref_pass.shape[0], bool)


TesterReward = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
TESTER_REWARDS: Registry[TesterReward] = Registry("tester reward")


@TESTER_REWARDS.register("gated")
def gated_tester_rewards(gen_pass: np.ndarray, correct: np.ndarray, known: np.ndarray) -> np.ndarray:
    """(m,) valid (passes every correct program) x share of incorrect programs failed (1 if none to catch).

    gen_pass: (k, m) bool; correct: (k,) bool; known: (k,) bool, whether program i's correctness is known
    (rows with known=False take part in nothing). No known-correct program: zeros (validity cannot be judged).
    """
    gen_pass, correct, known = (np.asarray(x, bool) for x in (gen_pass, correct, known))
    good, bad = known & correct, known & ~correct
    if not good.any():
        return np.zeros(gen_pass.shape[1])
    valid = gen_pass[good].all(axis=0)
    caught = (~gen_pass[bad]).mean(axis=0) if bad.any() else np.ones(gen_pass.shape[1])
    return valid * caught


@TESTER_REWARDS.register("balanced")
def balanced_tester_rewards(gen_pass: np.ndarray, correct: np.ndarray, known: np.ndarray) -> np.ndarray:
    """(m,) 1/2 share of correct programs passed + 1/2 share of incorrect programs failed (a missing class
    counts as fully satisfied)."""
    gen_pass, correct, known = (np.asarray(x, bool) for x in (gen_pass, correct, known))
    good, bad = known & correct, known & ~correct
    if not known.any():
        return np.zeros(gen_pass.shape[1])
    passed = gen_pass[good].mean(axis=0) if good.any() else np.ones(gen_pass.shape[1])
    caught = (~gen_pass[bad]).mean(axis=0) if bad.any() else np.ones(gen_pass.shape[1])
    return 0.5 * passed + 0.5 * caught


def tester_rewards(gen_pass: np.ndarray, correct: np.ndarray, known: np.ndarray | None = None,
                   mode: str = "gated") -> np.ndarray:
    """(m,) reward of each generated test; `mode` names a function in `TESTER_REWARDS`."""
    gen_pass = np.asarray(gen_pass, bool)
    known = np.ones(gen_pass.shape[0], bool) if known is None else np.asarray(known, bool)
    return TESTER_REWARDS.get(mode)(gen_pass, correct, known)


# ---------------------------------------------------------------------------------------------- the sandbox

@dataclass(frozen=True)
class MatrixLimits:
    per_test_s: float = 2.0  # each test (and loading the program) gets this long
    memory_mb: int = 512
    tests_per_run: int = 1  # generated tests sharing one tester process (1: a test can only spoil its own cell)
    max_workers: int | None = None  # judge calls running at once (None: one per CPU)


def _judge_limits(n_programs: int, n_tests: int, limits: MatrixLimits, trusted: bool) -> JudgeLimits:
    """Reference tests are trusted (their tester may be reused); generated ones get a tester of their own."""
    total = n_programs * (limits.per_test_s * (n_tests + 1) + 1.0)
    return JudgeLimits(test_s=limits.per_test_s, total_s=total, memory_mb=limits.memory_mb, output_bytes=1 << 16,
                       reuse_tester=trusted)


def pass_matrices(
    programs: Sequence[str], ref_tests: Sequence[str], gen_tests: Sequence[str], limits: MatrixLimits
) -> tuple[np.ndarray, np.ndarray]:
    """(R (k, r), A (k, m)) for one problem; see `pass_matrices_many` to run many problems together."""
    return pass_matrices_many([(programs, ref_tests, gen_tests)], limits)[0]


def pass_matrices_many(
    problems: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]], limits: MatrixLimits,
    stats: dict[str, int] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every program against every test of its problem (rlkit.sandbox.code_judge), all problems in parallel.

    Per problem one judge call for the reference tests (trusted, one tester process) and one per
    `tests_per_run` generated tests (own tester process: a test that kills it only fails its own cells);
    each call gives every program its own server process. `stats["processes"]` counts processes started.
    """
    calls: list[tuple[int, str, int, Sequence[str], Sequence[str]]] = []  # (problem, kind, first col, programs, tests)
    out = []
    for p, (programs, ref, gen) in enumerate(problems):
        out.append((np.zeros((len(programs), len(ref)), bool), np.zeros((len(programs), len(gen)), bool)))
        if not programs:
            continue
        if ref:
            calls.append((p, "ref", 0, programs, list(ref)))
        step = max(1, limits.tests_per_run)
        for j in range(0, len(gen), step):
            calls.append((p, "gen", j, programs, list(gen[j : j + step])))
    if not calls:
        return out
    workers = limits.max_workers or min(len(calls), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlkit-judge") as pool:
        verdicts = list(pool.map(
            lambda c: judge(c[3], c[4], _judge_limits(len(c[3]), len(c[4]), limits, c[1] == "ref")), calls))
    for (p, kind, j, _, tests), v in zip(calls, verdicts):
        matrix = out[p][0] if kind == "ref" else out[p][1]
        matrix[:, j : j + len(tests)] = np.array(v.passed(), bool).reshape(matrix.shape[0], len(tests))
    if stats is not None:
        stats["processes"] = stats.get("processes", 0) + sum(v.processes for v in verdicts)
    return out


def extract_test(response: str) -> str | None:
    """The generated unit test: the last code block (else the text), which must contain an `assert`."""
    code = extract_code(response).strip()
    return code if _ASSERT.search(code) else None


# ---------------------------------------------------------------------------------------------- batch hook


@dataclass
class _Problem:
    coder_rows: list[int] = field(default_factory=list)
    tester_rows: list[int] = field(default_factory=list)
    ref_tests: list[str] = field(default_factory=list)
    solution: str | None = None


def _role(data_source: str, extra_info: Any) -> str:
    if isinstance(extra_info, Mapping) and extra_info.get("role") in ("coder", "tester"):
        return str(extra_info["role"])
    return "tester" if data_source == TESTER_SOURCE else "coder"


@REWARD_MANAGERS.register("coevolve")
class CoevolveReward:
    """The `coevolve` reward manager: `__call__(batch) -> Batch(token_level_scores, ...)` for co-evolution batches.

    Rows are grouped by problem (`extra_info.task_id`, else the ground truth); rows of other
    data sources are scored by `fallback` (the rule manager, when built from a config).
    """

    def __init__(self, tokenizer: Any, limits: MatrixLimits | None = None, tester_mode: str = "gated",
                 fallback: Callable[[Batch], Batch] | None = None) -> None:
        TESTER_REWARDS.get(tester_mode)  # fail early on a bad name
        self.tokenizer, self.limits, self.tester_mode, self.fallback = tokenizer, limits or MatrixLimits(), \
            tester_mode, fallback

    @classmethod
    def from_config(cls, cfg: RLConfig, tokenizer: Any, *, tester_reward: str = "gated", tests_per_run: int = 1,
                    per_test_s: float = 2.0, memory_mb: int = 512) -> CoevolveReward:
        """`reward_model.reward_kwargs` set the tester reward (gated | balanced) and the sandbox limits;
        `reward_model.num_workers` judge calls run at once; other data sources get the rule manager."""
        from rlkit.reward.manager import RewardManager

        limits = MatrixLimits(per_test_s=per_test_s, memory_mb=memory_mb, tests_per_run=tests_per_run,
                              max_workers=cfg.reward_model.num_workers)
        return cls(tokenizer, limits, tester_reward, fallback=RewardManager.from_config(cfg, tokenizer))

    @staticmethod
    def check_config(cfg: RLConfig, *, tester_reward: str = "gated", **_: Any) -> None:
        """Both roles of a problem must share a batch: rows in file order, batches of an even size."""
        if tester_reward not in TESTER_REWARDS:
            raise UserError(f"reward_model.reward_kwargs.tester_reward='{tester_reward}' is not a tester reward; "
                            f"choose one of {TESTER_REWARDS.names()}")
        if cfg.data.shuffle or cfg.data.train_batch_size % 2:
            raise UserError("reward_model.reward_manager=coevolve: set data.shuffle=false and an even "
                            "data.train_batch_size so the coder and tester rows of a problem land in the same batch")

    def __call__(self, batch: Batch) -> Batch:
        return self.compute(batch)

    def compute(self, batch: Batch) -> Batch:
        start = time.perf_counter()
        mask = batch["response_mask"]
        texts = decode_responses(self.tokenizer, batch["responses"], mask)
        sources = [str(s) for s in batch["data_source"]]
        infos = batch["extra_info"] if "extra_info" in batch else [None] * len(batch)
        gts = [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in batch["reward_model"]]
        problems: dict[str, _Problem] = defaultdict(_Problem)
        others = []
        for i, (ds, info, gt) in enumerate(zip(sources, infos, gts)):
            if ds not in (CODER_SOURCE, TESTER_SOURCE):
                others.append(i)
                continue
            key = str(info.get("task_id")) if isinstance(info, Mapping) and info.get("task_id") else str(gt)
            prob = problems[key]
            (prob.tester_rows if _role(ds, info) == "tester" else prob.coder_rows).append(i)
            if not prob.ref_tests and gt is not None:
                prob.ref_tests = load_tests(gt, None).get("tests", [])
            if prob.solution is None and isinstance(info, Mapping) and info.get("solution"):
                prob.solution = str(info["solution"])

        scores = np.zeros(len(batch))
        extras: dict[str, list[Any]] = {"role": [None] * len(batch), "valid_test": [None] * len(batch)}
        order = list(problems.values())
        specs = []
        for prob in order:
            programs = [extract_code(texts[i]) for i in prob.coder_rows]
            if prob.solution is not None:
                programs.append(prob.solution)
            tests = [extract_test(texts[i]) for i in prob.tester_rows]
            specs.append((programs, prob.ref_tests, [t if t is not None else "assert False" for t in tests]))
        counts: dict[str, int] = {}
        matrices = pass_matrices_many(specs, self.limits, counts)
        stats: dict[str, list[float]] = defaultdict(list)
        for prob, (programs, _, _), (ref_pass, gen_pass) in zip(order, specs, matrices):
            k = len(prob.coder_rows)
            coder = coder_rewards(ref_pass[:k], gen_pass[:k])
            correct = correct_programs(ref_pass)
            known = np.full(len(programs), bool(prob.ref_tests))
            if prob.solution is not None:  # the reference solution is correct by definition
                correct[-1], known[-1] = True, True
            testers = tester_rewards(gen_pass, correct, known, self.tester_mode)
            valid = gen_pass[correct & known].all(axis=0) if (correct & known).any() else np.zeros(len(testers), bool)
            for row, value in zip(prob.coder_rows, coder):
                scores[row], extras["role"][row] = value, "coder"
            for col, (row, value) in enumerate(zip(prob.tester_rows, testers)):
                scores[row], extras["role"][row], extras["valid_test"][row] = value, "tester", bool(valid[col])
            stats["coevolve/coder_reward/mean"] += list(coder)
            stats["coevolve/tester_reward/mean"] += list(testers)
            stats["coevolve/valid_test/frac"] += [float(v) for v in valid]
            stats["coevolve/correct_program/frac"] += [float(c) for c in correct[:k]]
            stats["coevolve/unpaired_problems"].append(float(not prob.coder_rows or not prob.tester_rows))

        token_scores = on_last_token(torch.from_numpy(scores), mask)
        metrics: dict[str, list[float]] = {k: [float(np.mean(v))] if v else [0.0] for k, v in stats.items()}
        metrics["coevolve/sandbox_runs"] = [float(counts.get("processes", 0))]
        if others and self.fallback is not None:
            sub = self.fallback(batch.index(others))
            token_scores[others] = sub["token_level_scores"]
            for k, v in sub.meta.get(METRICS_KEY, {}).items():
                metrics[k] = v if isinstance(v, list) else [v]
        metrics["timing_s/coevolve_reward"] = [time.perf_counter() - start]
        non_tensors = {f"reward_extra/{k}": v for k, v in extras.items()}
        return Batch({"token_level_scores": token_scores}, non_tensors, {METRICS_KEY: metrics})

