"""verl's own PPO/GRPO run scripts through `rlkit train`: how many pass `--dry-run` unchanged, and do they train.

    .venv/bin/python bench/verl_scripts.py --verl /tmp/verl_b178a3cd --verl /tmp/verl_a0248a8f --label after

Each `--verl DIR` is an export of verl's repository at one commit (`git archive <commit> | tar -x -C DIR`;
nothing of verl is committed here). For every shell script under DIR/examples that calls
`verl.trainer.main_ppo`, the script itself is run by bash, in DIR, with `python`/`python3`/`torchrun`/`ray`
(and the few other commands a script may call: downloads, `nvidia-smi`, `sleep`) replaced by a shim that
records its arguments; so line continuations, `$VAR`/`${VAR:-default}`, `$((...))`, arrays, quotes and
`"$@"` (empty) are expanded by bash exactly as for a verl user. The arguments after `-m verl.trainer.main_ppo`
are the overrides. Only these are rewritten:

- data paths: `data.train_files`/`data.val_files` (or verl's default, ~/data/gsm8k, where a script gives none)
  -> GSM8K parquet made by `rlkit data gsm8k`
  (from ../shared/data/gsm8k when present, else the offline copy): the first 4096 train rows (the largest
  batch), 16 test rows;
- model paths (`*.model.path`, `*tokenizer_path`, `*.input_tokenizer`) -> a tiny random model whose maximum
  positions cover every script's lengths (a tiny scoring model for a discriminative `reward_model.model.path`; a
  tiny Qwen3-MoE for a mixture-of-experts script: its model's published name, or routing replay or expert
  parallelism above 1 in its keys);
- output folders (keys ending `_dir`, `save_path`, `output_dir`) -> a folder of the bench;
- GPU/node counts: `trainer.n_gpus_per_node` at most 2 (2 where a script keeps verl's default of 8), every
  `*nnodes`=1, any other `*n_gpus_per_node`=1, and the parallel sizes (`*_parallel_size`) capped at those 2 workers.

Each script's overrides then go through `rlkit train --dry-run` (in this process, through the CLI's own
entry, so ~200 scripts take minutes, not an hour). A failing script is classified by its first stop: the
config key named in the error line (or the first words of the line when it names none).

Then a seeded sample of `--sample` accepted scripts runs for real for one step, each as its own `rlkit train`
process: batch sizes and lengths shrunk (`--shrink` below), `trainer.total_training_steps=1`, no other change.

Results: bench/results/verl_scripts.json (one entry per `--label`: `before` = the tree before issue 43's work,
`after` = with it) and bench/results/verl_scripts.md (tables per label and commit).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
SHIMMED = ("python", "python3", "torchrun", "ray", "nvidia-smi", "huggingface-cli", "hf", "wget", "curl", "pip",
           "pip3", "sleep", "git", "ssh", "srun", "sbatch", "modelscope", "uv", "rm", "hdfs", "aws", "conda")
ENTRY = "verl.trainer.main_ppo"
SHIM = """#!/bin/sh
f="$VERL_BENCH_RECORD/$(date +%s%N)_$$"
{ printf '%s\\0' "$(basename "$0")"; for a in "$@"; do printf '%s\\0' "$a"; done; } > "$f"
exit 0
"""
WORLD = 2  # CPU worker processes: trainer.n_gpus_per_node after the rewrite
TRAIN_ROWS = 4096  # the largest data.train_batch_size of the scripts (the pre-flight reads and tokenizes every row)
VAL_ROWS = 16  # the validation file: the first rows of GSM8K's test split (a real step validates before training)
MAX_POSITIONS = 1 << 17  # the tiny model's maximum positions: above every script's prompt + response


# ----------------------------------------------------------------------------------------- extraction
def ppo_scripts(root: Path) -> list[Path]:
    """The shell scripts under examples/ that call verl's PPO trainer."""
    out = []
    for path in sorted((root / "examples").rglob("*.sh")):
        text = path.read_text(errors="replace")
        if re.search(r"verl\.trainer\.main_ppo\b", text):
            out.append(path)
    return out


def make_shims(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHIMMED:
        shim = folder / name
        shim.write_text(SHIM)
        shim.chmod(0o755)
    return folder


def record_calls(script: Path, root: Path, shims: Path, home: Path) -> list[list[str]]:
    """Run `script` with bash in `root`, the shimmed commands recording their argv; every recorded call."""
    with tempfile.TemporaryDirectory(prefix="verl_rec_") as rec:
        env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(home), "VERL_BENCH_RECORD": rec, "USER": "bench",
               "LANG": "C.UTF-8", "PWD": str(root)}
        try:
            subprocess.run(["bash", str(script)], cwd=root, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except subprocess.TimeoutExpired:
            pass
        calls = []
        for f in sorted(Path(rec).iterdir()):
            parts = f.read_bytes().split(b"\0")
            calls.append([p.decode(errors="replace") for p in parts[:-1]])
        return calls


def lenient_copy(script: Path) -> Path:
    """The script with `set -e`/`set -u` dropped (a verl user has set the environment variables it reads
    unguarded, e.g. `$HDFS_ROOT`, and has conda): written beside it, so relative paths stay the same."""
    text = re.sub(r"^(\s*set\s+)-([a-z]+)", lambda m: m.group(1) + "-" + (m.group(2).replace("e", "")
                  .replace("u", "") or "x"), script.read_text(errors="replace"), flags=re.M)
    copy = script.with_name(script.stem + ".rlkit_bench.sh")
    copy.write_text(text)
    return copy


def script_args(script: Path, root: Path, shims: Path, home: Path) -> list[str] | None:
    """The main_ppo arguments of `script`, run as is; else run without `set -eu`."""
    args = main_ppo_args(record_calls(script, root, shims, home))
    if args is None:
        copy = lenient_copy(script)
        try:
            args = main_ppo_args(record_calls(copy, root, shims, home))
        finally:
            copy.unlink()
    return args


def main_ppo_args(calls: list[list[str]]) -> list[str] | None:
    """The arguments after `-m verl.trainer.main_ppo` of the first call that runs it (under `ray job submit`
    or `torchrun` too)."""
    for argv in calls:
        for i in range(1, len(argv)):
            if argv[i] == ENTRY and argv[i - 1] == "-m" or argv[i] == f"-m{ENTRY}":
                return argv[i + 1:]
    return None


def split_options(args: list[str]) -> tuple[list[str], list[str]]:
    """(`--config-path`/`--config-name` options, overrides)."""
    options, overrides, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a in ("--config-path", "--config-name", "-cp", "-cn") and i + 1 < len(args):
            options += [a if a.startswith("--") else {"-cp": "--config-path", "-cn": "--config-name"}[a], args[i + 1]]
            i += 2
            continue
        if a.startswith(("--config-path=", "--config-name=")):
            options += a.split("=", 1)
        elif a.strip():
            overrides.append(a)
        i += 1
    return options, overrides


# ----------------------------------------------------------------------------------------- rewriting
def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _int(value: str) -> int | None:
    try:
        return int(value.strip().strip("'\""))
    except ValueError:
        return None


#: a mixture-of-experts script: by its model's published name, or by keys only an MoE model uses
MOE_NAME = re.compile(r"(?i)moe|-a\d+(\.\d+)?b\b|mixtral|deepseek-v[23]|dsv3|qwen3-?(30|235)b")
MOE_KEY = re.compile(r"(router_replay\.mode=R[23]|router_replay=[Tt]rue|expert_model_parallel_size=([2-9]|\d\d))")


def is_moe(overrides: list[str]) -> bool:
    return any(MOE_KEY.search(o) or (_key(o).endswith("model.path") and MOE_NAME.search(o)) for o in overrides)


def rewrite(overrides: list[str], paths: dict[str, str]) -> list[str]:
    """Only data/model paths, output folders and GPU/node counts changed (see the module's docstring)."""
    generative_rm = any(re.match(r"(reward\.)?reward_model\.rollout\.", _key(o)) for o in overrides)
    policy = paths["moe"] if is_moe(overrides) else paths["model"]
    out = []
    for o in overrides:
        if "=" not in o or o.startswith("~"):
            out.append(o)
            continue
        key, value = o.split("=", 1)
        bare, leaf = key.lstrip("+"), key.rsplit(".", 1)[-1]
        new = value
        if bare == "data.train_files":
            new = paths["train"]
        elif bare == "data.val_files":
            new = paths["test"]
        elif bare.endswith("model.path") or leaf in ("tokenizer_path", "input_tokenizer"):
            # a scoring model by its published name (FsfairX-LLaMA3-RM, Skywork-Reward...) even when an engine serves it
            scoring = not generative_rm or re.search(r"(?i)-RM\b|-RM-|reward", value) is not None
            rm = bare.startswith(("reward_model.", "reward.reward_model.")) and scoring
            new = paths["rm"] if rm else policy
        elif leaf.endswith("_dir") or leaf in ("save_path", "output_dir"):
            new = str(Path(paths["out"]) / leaf)
        elif bare == "trainer.n_gpus_per_node":
            new = str(min(_int(value) or WORLD, WORLD))
        elif leaf == "nnodes":
            new = "1"
        elif leaf == "n_gpus_per_node":
            new = "1"
        elif leaf.endswith("_parallel_size") and (_int(value) or 0) > WORLD:
            new = str(WORLD)
        out.append(f"{key}={new}")
    if not any(_key(o) == "trainer.n_gpus_per_node" for o in out):  # verl's default is 8 GPUs: rewritten to WORLD
        out.append(f"trainer.n_gpus_per_node={WORLD}")
    for key, path in (("data.train_files", paths["train"]), ("data.val_files", paths["test"])):
        if not any(_key(o) == key for o in out):  # verl's default, ~/data/gsm8k/*.parquet, is a data path too
            out.append(f"{key}={path}")
    return out


#: the real step's shrink: key suffix -> the largest value kept (batch sizes, samples, lengths)
SHRINK = {
    "data.train_batch_size": 4, "data.gen_batch_size": 4, "data.val_batch_size": 8,
    "data.max_prompt_length": 384, "data.max_response_length": 16,
    "rollout.n": 2, "val_kwargs.n": 1,
    "ppo_mini_batch_size": 4, "ppo_micro_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2,
    "log_prob_micro_batch_size": 4, "log_prob_micro_batch_size_per_gpu": 2,
    "micro_batch_size_per_gpu": 2, "forward_micro_batch_size_per_gpu": 2, "response_length": 16,
    "prompt_length": 384,
}


def shrink(overrides: list[str]) -> list[str]:
    out = []
    for o in overrides:
        key = _key(o)
        cap = next((c for suffix, c in SHRINK.items() if key == suffix or key.endswith("." + suffix)), None)
        v = _int(o.split("=", 1)[1]) if "=" in o else None
        out.append(f"{o.split('=', 1)[0]}={cap}" if cap is not None and v is not None and v > cap else o)
    keys = {_key(o) for o in out}
    for key, value in (("data.train_batch_size", 4), ("data.max_response_length", 16),
                       ("data.max_prompt_length", 384), ("actor_rollout_ref.rollout.n", 2)):
        if key not in keys:
            out.append(f"{key}={value}")
    return [*out, "trainer.total_training_steps=1"]


# ----------------------------------------------------------------------------------------- fixtures
def fixtures(work: Path) -> dict[str, str]:
    """GSM8K parquet (rlkit data gsm8k), a tiny model with long maximum positions, a tiny scoring model."""
    data = work / "gsm8k"
    if not (data / "val.parquet").is_file():
        source = REPO.parent / "shared" / "data" / "gsm8k"
        cmd = [str(REPO / ".venv" / "bin" / "rlkit"), "data", "gsm8k", "--out", str(data), "--force",
               *(["--source", str(source)] if source.is_dir() else ["--no-hub"])]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        import pyarrow.parquet as pq

        pq.write_table(pq.read_table(data / "train.parquet").slice(0, TRAIN_ROWS), data / "train.parquet")
        pq.write_table(pq.read_table(data / "test.parquet").slice(0, VAL_ROWS), data / "val.parquet")
    model, rm, moe = work / "tiny_model", work / "tiny_rm", work / "tiny_moe"
    if not (moe / "config.json").is_file():
        from rlkit.testing import build_tiny_moe

        net, tok = build_tiny_moe("qwen3_moe", hidden=128, heads=2, experts=4)  # head_dim 64, 2 heads for TP/SP 2
        net.config.max_position_embeddings = MAX_POSITIONS
        net.save_pretrained(moe)
        tok.save_pretrained(moe)
    if not (model / "config.json").is_file():
        from rlkit.testing import build_tiny_model, build_tiny_tokenizer, save_tiny_reward_model

        tok = build_tiny_tokenizer()
        net = build_tiny_model(tok, heads=2)  # head_dim 32: vLLM's CPU attention has no head_dim-16 kernel
        net.config.max_position_embeddings = MAX_POSITIONS
        net.generation_config.eos_token_id = tok.eos_token_id
        net.generation_config.pad_token_id = tok.pad_token_id
        net.save_pretrained(model)
        tok.save_pretrained(model)
        save_tiny_reward_model(rm)
        cfg = json.loads((rm / "config.json").read_text())
        cfg["max_position_embeddings"] = MAX_POSITIONS
        (rm / "config.json").write_text(json.dumps(cfg))
    out = work / "out"
    out.mkdir(exist_ok=True)
    return {"train": str(data / "train.parquet"), "test": str(data / "val.parquet"), "model": str(model),
            "rm": str(rm), "moe": str(moe), "out": str(out)}


# ----------------------------------------------------------------------------------------- classification
_KEY_IN_LINE = (
    r"config key '([^'=]+)", r"unknown config key '([^']+)'", r"bad value for '([^']+)'", r"verl key ([^\s=]+)",
    r"override '\+*([^'=]+)", r"'([a-z_]+(?:\.[a-z_0-9]+)+)'", r"\b((?:actor_rollout_ref|critic|reward_model|"
    r"reward|data|trainer|algorithm|ray_kwargs|global_profiler|hydra)(?:\.[A-Za-z_0-9]+)+)",
)


def stop_class(line: str) -> str:
    """The key an error line names (role prefixes kept), else its first words."""
    for pattern in _KEY_IN_LINE:
        m = re.search(pattern, line)
        if m:
            return m.group(1)
    return " ".join(line.split()[:8])


def error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("error:", "Error:", "rlkit: error", "config", "unknown", "bad value", "override",
                          "pre-flight", "preflight")) or "not supported" in ln or "Error" in ln:
            return ln
    return lines[-1] if lines else "(no output)"


def dry_run(options: list[str], overrides: list[str], cwd: Path) -> tuple[bool, str]:
    """`rlkit train [options] --dry-run overrides`, in this process through the CLI's entry."""
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, ["train", *options, "--dry-run", *overrides], catch_exceptions=True)
    finally:
        os.chdir(here)
    if result.exit_code == 0:
        return True, ""
    text = (result.output or "") + (getattr(result, "stderr", "") or "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += f"\ntraceback: {type(result.exception).__name__}: {result.exception}"
    return False, error_line(text)


def use_tree(tree: str | None) -> None:
    """Import rlkit from another checkout (`--tree`, e.g. an export of the commit before a change) instead of the
    editable install of this one."""
    if not tree:
        return
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()
                        and "editable" not in getattr(f, "__name__", "").lower()]
    sys.path.insert(0, tree)


def real_step(options: list[str], overrides: list[str], cwd: Path, timeout: int,
              log: Path | None = None) -> tuple[bool, str, float]:
    """One `rlkit train` process (the CLI of `RLKIT_BENCH_TREE` when set)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cli", "train", *options, *overrides]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout}s", time.monotonic() - start
    took = time.monotonic() - start
    text = proc.stdout + proc.stderr
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    return proc.returncode == 0, "" if proc.returncode == 0 else error_line(_plain(text)), took


def _plain(text: str) -> str:
    """Output without rich's traceback boxes (their lines are source excerpts, not the error)."""
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("│", "╭", "╰")))


# ----------------------------------------------------------------------------------------- main
def bench_commit(root: Path, paths: dict[str, str], shims: Path, home: Path, order_seed: int | None = None) -> dict:
    """Every PPO script of `root` through --dry-run (in a seeded random order with `order_seed`, so a run cut short
    has measured a random sample, not the first folders)."""
    scripts, rows = ppo_scripts(root), []
    if order_seed is not None:
        random.Random(order_seed).shuffle(scripts)
    for script in scripts:
        rel = str(script.relative_to(root))
        args = script_args(script, root, shims, home)
        if args is None:
            rows.append({"script": rel, "ok": False, "stop": "(the script did not reach main_ppo in bash)",
                         "line": ""})
            continue
        options, overrides = split_options(args)
        overrides = rewrite(overrides, paths)
        ok, line = dry_run(options, overrides, root)
        rows.append({"script": rel, "ok": ok, "stop": "" if ok else stop_class(line), "line": line,
                     "options": options, "overrides": overrides})
        print(f"{'ok  ' if ok else 'STOP'} {rel} {'' if ok else '-> ' + line[:160]}", flush=True)
    return {"root": str(root), "scripts": len(rows), "dry_run_ok": sum(r["ok"] for r in rows), "rows": rows}


def summary(commit: dict) -> dict:
    stops = collections.Counter(r["stop"] for r in commit["rows"] if not r["ok"])
    return {"scripts": commit["scripts"], "dry_run_ok": commit["dry_run_ok"],
            "dry_run_ok_pct": round(100 * commit["dry_run_ok"] / max(commit["scripts"], 1), 1),
            "stops": dict(stops.most_common())}


def write_markdown(results: dict, path: Path) -> None:
    lines = ["# verl's PPO/GRPO example scripts through `rlkit train`", "",
             "Made by `bench/verl_scripts.py` (its docstring says what is rewritten). `before`: the tree before "
             "issue 43's work; `after`: with it.", ""]
    for label, entry in results.items():
        lines += [f"## {label} ({entry.get('rlkit_commit', '?')})", ""]
        if entry.get("note"):
            lines += [f"Note: {entry['note']}.", ""]
        lines += ["| verl commit | scripts | pass --dry-run | % |", "|---|---:|---:|---:|"]
        for name, commit in entry["commits"].items():
            s = summary(commit)
            lines.append(f"| {name} | {s['scripts']} | {s['dry_run_ok']} | {s['dry_run_ok_pct']} |")
        lines += ["", "First stop of each failing script, by the key named in its error line:", "",
                  "| stop | " + " | ".join(entry["commits"]) + " |", "|---|" + "---:|" * len(entry["commits"])]
        keys = collections.Counter()
        for commit in entry["commits"].values():
            keys.update(summary(commit)["stops"])
        for key, _ in keys.most_common():
            counts = [str(summary(c)["stops"].get(key, 0)) for c in entry["commits"].values()]
            lines.append(f"| `{key}` | " + " | ".join(counts) + " |")
        for key, what in (("real_steps", "seeded sample of accepted scripts"), ("real_steps_extra", "named scripts "
                                                                                   "outside the sample (--also)")):
            runs = entry.get(key, [])
            if not runs:
                continue
            ok = sum(r["ok"] for r in runs)
            lines += ["", f"One real step, {what}: **{ok} of {len(runs)}** trained.", "",
                      "| verl commit | script | trained | s | stop |", "|---|---|---|---:|---|"]
            for r in runs:
                lines.append(f"| {r['commit']} | {r['script']} | {'yes' if r['ok'] else 'no'} | {r['seconds']:.0f} "
                             f"| {r['line'][:140].replace('|', '/')} |")
        lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    use_tree(os.environ.get("RLKIT_BENCH_TREE"))
    if sys.argv[1:2] == ["--cli"]:  # a real step's process: the rlkit CLI of the chosen tree
        from rlkit_cli.main import main as cli

        sys.argv = ["rlkit", *sys.argv[2:]]
        cli()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl", action="append", required=True, help="an export of verl's repository at one commit")
    ap.add_argument("--label", default="after", help="the results entry to (re)write (before|after)")
    ap.add_argument("--sample", type=int, default=10, help="accepted scripts run for one real step (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per real step")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "rlkit_verl_bench"))
    ap.add_argument("--out", default=str(RESULTS / "verl_scripts"))
    ap.add_argument("--order-seed", type=int, help="run the scripts in this seeded random order (default: by path)")
    ap.add_argument("--reuse", action="store_true", help="take the dry runs of --label from --out's JSON (the "
                    "commits it holds are not run again; e.g. to run the real steps after two dry-run processes)")
    ap.add_argument("--tree", help="an rlkit checkout to measure instead of this one (e.g. `git archive` of HEAD)")
    ap.add_argument("--also", action="append", default=[],
                    help="an accepted script (path under the verl export, e.g. examples/x/run.sh) also run for one "
                         "real step, outside the sample (real_steps_extra)")
    ap.add_argument("--note", default="", help="a line kept with the entry (machine, load, what differs)")
    args = ap.parse_args()
    if args.tree:
        os.environ["RLKIT_BENCH_TREE"] = str(Path(args.tree).resolve())
        use_tree(os.environ["RLKIT_BENCH_TREE"])
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths, shims = fixtures(work), make_shims(work / "shims")
    home = work / "home"
    home.mkdir(exist_ok=True)
    out = Path(args.out)
    store = out.with_suffix(".json")
    results = json.loads(store.read_text()) if store.is_file() else {}
    commits = results.get(args.label, {}).get("commits", {}) if args.reuse else {}
    for root in map(Path, args.verl):
        name = root.name.removeprefix("verl_")
        if name not in commits:
            commits[name] = bench_commit(root.resolve(), paths, shims, home, args.order_seed)
        print(json.dumps({name: summary(commits[name])}, indent=1), flush=True)
    rlkit_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                  text=True).stdout.strip() + (f" (tree {args.tree})" if args.tree else " + work tree")
    entry = {"rlkit_commit": rlkit_commit, "commits": commits, "real_steps": [], "real_steps_extra": [],
             **({"note": args.note} if args.note else {})}
    accepted = [(name, r) for name, c in commits.items() for r in c["rows"] if r["ok"]]
    sample = random.Random(args.seed).sample(accepted, min(args.sample, len(accepted)))
    extra = [(name, r) for name, r in accepted if r["script"] in args.also and (name, r) not in sample]
    for runs, chosen in (("real_steps", sample), ("real_steps_extra", extra)):
        for name, row in chosen:
            root = Path(commits[name]["root"])
            overrides = shrink(row["overrides"])
            log = work / "steps" / f"{name}_{row['script'].replace('/', '_')}.log"
            ok, line, took = real_step(row["options"], overrides, root, args.timeout, log)
            entry[runs].append({"commit": name, "script": row["script"], "ok": ok, "line": line,
                                "seconds": round(took, 1), "overrides": overrides})
            print(f"{'STEP' if ok else 'FAIL'} {name} {row['script']} {took:.0f}s {line[:200]}", flush=True)
    results = json.loads(store.read_text()) if store.is_file() else {}  # again: another run may have written
    results[args.label] = entry
    store.write_text(json.dumps(results, indent=1) + "\n")
    write_markdown(results, out.with_suffix(".md"))
    print(f"wrote {store} and {out.with_suffix('.md')}; shell: {shlex.join(sys.argv)}")
    shutil.rmtree(work / "out", ignore_errors=True)


if __name__ == "__main__":
    main()
