"""Generate docs/verl.md (moving a verl run script, and the table of verl keys rlkit maps or refuses) from
rlkit.config.verl_keys, so it cannot drift: `python -m rlkit.config.verl_doc > docs/verl.md` (a test checks it)."""

from __future__ import annotations

from rlkit.config.verl_keys import VERL_KEYS
from rlkit.config.verl_rules import Kind, VerlKey

GUIDE = """# Moving a verl run script to rlkit

rlkit reads verl's configuration keys. A verl script changes in one line: the launcher.

```bash
# before                                    # after
python3 -m verl.trainer.main_ppo \\          rlkit train \\
    algorithm.adv_estimator=grpo \\              algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/train.parquet \\ data.train_files=$HOME/data/train.parquet \\
    ...                                           ...
```

- **No preset needed.** Without one, `rlkit train` starts from verl's `main_ppo` defaults: the algorithm is
  `algorithm.adv_estimator` (default `gae`, PPO with a critic, as in verl). A preset (`rlkit train grpo ...`) still
  works and is applied below the script's keys.
- **verl's config names.** `--config-path <dir> --config-name ppo_trainer` (or `ppo_megatron_trainer`) is rlkit's
  schema, whether or not `<dir>` exists here; a recipe's own YAML with `defaults: [ppo_trainer, _self_]` composes
  over it as in verl.
- **Every verl key is one of three things**, in both of verl's layouts (the current one with `reward.*`, and the
  older one with `reward_model.*` / `reward_manager.*` at the top level that most published scripts use):
  - *implemented*: rlkit's schema has the key under verl's name and meaning (docs/config.md), or the same setting
    under rlkit's name (the alias rows below; the value moves there without a word);
  - *mapped*: rlkit sets its nearest equivalent, or there is nothing to set, and prints one line at start-up
    (also with `--dry-run`) saying what became what, e.g.
    `verl key actor_rollout_ref.actor.strategy=megatron -> FSDP2: ...`;
  - *refused*: one error line names the key, why, and what to use instead; a refused key set to a value that asks
    for nothing (the feature's switch off, e.g. `profiler.enable=false`) is accepted with a line.
  Nothing is accepted and silently ignored; a key verl does not have either is an error naming the closest keys.
- **What is refused, and what is not.** A key is refused only when its value would change *what is computed* and
  rlkit cannot compute it: an accelerator rlkit does not drive (`trainer.device=npu`), an algorithm or data it
  lacks (quantisation-aware training, audio, raw-logit rollout log-probs, a verl tool class). A key that tunes
  speed, memory, the parallel layout, logging, profiling, checkpoint housekeeping or the launcher is accepted:
  implemented where rlkit has the equivalent (e.g. `ray_kwargs.ray_init.*` goes to `ray.init`, `runtime_env`
  included), else mapped with one line saying what rlkit does instead (e.g. `rollout.cudagraph_capture_sizes`,
  `rollout.engine_kwargs.sglang`, `global_profiler.tool=nsys`, `trainer.default_hdfs_dir`). Every refused row
  below is such a computation, or a parameter of one.
- **Trackers.** `trainer.logger=['console','wandb']` works out of the box: wandb is installed by the default
  set-up, and without an API key or network it logs offline with one line giving the `wandb sync` command.
- **Run it with `--dry-run` first**: it prints the mapped keys' lines, the resolved config and the resource plan,
  and runs the pre-flight checks.

What differs by design: rlkit trains every role with FSDP2 (Megatron's parallel sizes become FSDP2 sharding,
context parallelism becomes Ulysses sequence parallelism), generates with vLLM or HF (`rollout.name=sglang` runs
on vLLM with the same sampling settings), and runs code rewards in its own sandbox (no SandboxFusion).

## The keys rlkit maps or refuses

Patterns: `*` is one name, `**` any keys below, `{a,b}` one of the names. First match wins; rlkit's own keys
(docs/config.md) come first.
"""


ENTRY_POINTS = """
## verl's other entry points

- **SFT**: `torchrun ... -m verl.trainer.fsdp_sft_trainer KEYS` and `torchrun ... -m verl.trainer.sft_trainer KEYS`
  become `rlkit train sft KEYS` with the same keys (docs/sft.md); torchrun's `--nproc_per_node` is
  `trainer.n_gpus_per_node` here. Sequence parallelism (`ulysses_sequence_parallel_size`,
  `engine.ulysses_sequence_parallel_size`) is accepted with one line (rlkit's SFT trainer holds whole conversations),
  verl's `engine=fsdp` / `optim=fsdp` groups are accepted, `engine=megatron` is refused. Of verl's 10
  `examples/sft` scripts, 9 pass `rlkit train sft --dry-run` with only paths rewritten; the VLM one is refused
  (rlkit's SFT trainer reads text only). `rlkit train sft` and `rlkit train dpo` also read TRL's dataset formats
  (JSON Lines, JSON, parquet; `prompt`/`completion`, `text`, `messages`, `prompt`/`chosen`/`rejected` and
  implicit-prompt pairs).
- **Generation**: `python3 -m verl.trainer.main_generation KEYS` becomes `rlkit generate KEYS` with verl's keys
  (`data.path`, `data.prompt_key`, `data.n_samples`, `data.output_path`, `data.batch_size`, `model.path`,
  `rollout.*`), in one process; it writes the input rows plus a `responses` column of `n_samples` strings per row,
  as verl does. `trainer.*`, `actor.*` and `ray_kwargs.*` have nothing to set there (one line says so).
"""


def _row(rule: VerlKey) -> str:
    what = rule.why.replace("|", "\\|")
    if rule.kind is Kind.REFUSED and rule.switch:
        what += f" (accepted while `{rule.switch}` is off)"
    return f"| `{rule.pattern}` | {rule.kind.value if not rule.is_alias else 'implemented (alias)'} | {what} |"


def render() -> str:
    lines = [GUIDE, "| verl key | class | what rlkit does |", "|---|---|---|"]
    lines += [_row(rule) for rule in VERL_KEYS]
    counts = {kind: sum(1 for r in VERL_KEYS if r.kind is kind) for kind in Kind}
    lines.append("")
    lines.append(f"{len(VERL_KEYS)} rules: {counts[Kind.IMPLEMENTED]} aliases, {counts[Kind.MAPPED]} mapped, "
                 f"{counts[Kind.REFUSED]} refused.")
    return "\n".join(lines) + "\n" + ENTRY_POINTS


if __name__ == "__main__":
    print(render(), end="")
