"""The plots of a run, one set of panels drawn two ways: in the terminal (plotext) and as a PNG (matplotlib).

Which curves matter depends on the trainer (`CURVES`, by family: RL, SFT, DPO); `--metric` globs pick any others.
A panel is built from the metrics rows once (`Panel`), so the terminal, the image, `rlkit top` and the quickstart's
end all show the same numbers.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Series = tuple[list[float], list[float]]  # (steps, values)


@dataclass
class Panel:
    title: str
    series: dict[str, Series] = field(default_factory=dict)  # label -> (x, y): lines over steps
    bars: dict[str, float] = field(default_factory=dict)  # label -> value: a bar chart (timing per phase)
    xlabel: str = "step"


#: family -> [(panel title, metric globs)]; a trainer kind not registered reads as RL (every estimator's name)
CURVES: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "rl": [
    ("reward and validation score", ("critic/score/mean", "val/*score/mean*", "val-core/*")),
    ("response length", ("response_length/mean",)),
    ("entropy", ("actor/entropy",)),
    ("KL / clip fraction", ("actor/ppo_kl", "actor/pg_clipfrac", "actor/kl_loss", "critic/vf_clipfrac")),
    ("loss", ("actor/pg_loss", "critic/vf_loss")),
],
    "sft": [
    ("loss", ("train/loss", "val/loss")),
    ("perplexity", ("val/perplexity",)),
],
    "dpo": [
    ("loss", ("train/loss", "val/loss")),
    ("accuracy", ("*accuracies*",)),
    ("margins", ("*margins*",)),
    ],
}
MEMORY_GLOBS = ("memory/driver/rss_peak_gb", "memory/worker/rss_peak_gb", "memory/*/cuda_peak_gb*")
REWARD_PANEL = 0  # the first RL panel: what `rlkit top` and the quickstart show


def family(kind: str) -> str:
    return kind if kind in CURVES else "rl"


def series(rows: list[dict[str, Any]], patterns: tuple[str, ...], label_prefix: str = "") -> dict[str, Series]:
    """Every key matching `patterns` (globs, in their order) -> its (steps, values), finite values only."""
    keys: list[str] = []
    seen = set()
    for pattern in patterns:
        for row in rows:
            for key in row:
                if key not in seen and key not in ("step", "time") and fnmatch.fnmatchcase(key, pattern):
                    seen.add(key)
                    keys.append(key)
    out: dict[str, Series] = {}
    for key in keys:
        xs, ys = [], []
        for row in rows:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value) and isinstance(row.get("step"), (int, float)):
                xs.append(float(row["step"]))
                ys.append(float(value))
        if xs:
            out[label_prefix + key] = (xs, ys)
    return out


def timing_bars(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per phase of a training step (`timing_s/<phase>`, the step's own total left out)."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        if "timing_s/step" not in row:
            continue
        for key, value in row.items():
            if key.startswith("timing_s/") and key != "timing_s/step" and isinstance(value, (int, float)):
                sums.setdefault(key.removeprefix("timing_s/"), []).append(float(value))
    return {k: sum(v) / len(v) for k, v in sorted(sums.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))}


def build_panels(runs: list[tuple[str, list[dict[str, Any]]]], kind: str,
                 metrics: list[str] | None = None) -> list[Panel]:
    """The panels of one run (or several overlaid: `runs` = [(label, rows)], labels prefixed when more than one).
    `metrics` (globs): one panel each instead of the trainer's curves."""
    many = len(runs) > 1
    groups = [(m, (m,)) for m in metrics] if metrics else CURVES[family(kind)]
    panels = []
    for title, patterns in groups:
        panel = Panel(title)
        for label, rows in runs:
            panel.series.update(series(rows, patterns, f"{label}: " if many else ""))
        if panel.series:
            panels.append(panel)
    if metrics:
        return panels
    memory = Panel("memory per process (GB)")
    for label, rows in runs:
        memory.series.update(series(rows, MEMORY_GLOBS, f"{label}: " if many else ""))
    if memory.series:
        panels.append(memory)
    for label, rows in runs:
        bars = timing_bars(rows)
        if bars:
            panels.append(Panel(f"seconds per step by phase{f' ({label})' if many else ''}", bars=bars,
                                xlabel="seconds"))
    return panels


def missing_metrics(rows_of_runs: list[list[dict[str, Any]]], metrics: list[str]) -> list[str]:
    """The `--metric` globs no row matches."""
    keys = {k for rows in rows_of_runs for row in rows for k in row}
    return [m for m in metrics if not any(fnmatch.fnmatchcase(k, m) for k in keys)]


def terminal(panels: list[Panel], width: int = 100, height: int = 16, color: bool = False,
             legend: bool = True) -> str:
    """The panels drawn with plotext (its explicit-figure API, 6.x), one under the other, as text; `legend=False`
    for small screens, where the legend box would hide the curve."""
    import plotext as plt

    fig = plt.figure
    out = []
    for panel in panels:
        fig.clear()
        rows = max(height, 2 * len(panel.series) + 8) if legend else height  # plotext drops a legend that does not fit
        fig.plot_size(width, rows if panel.series else max(10, height * 2 // 3))
        if panel.series:
            for label, (xs, ys) in panel.series.items():
                signal = fig.signal(xs, ys)
                if legend:
                    signal.label(label)
                if len(xs) > 1:
                    signal.lines()
                fig.draw(signal)
        else:  # vertical bars: plotext 6.1 scales horizontal ones wrongly
            fig.draw(fig.bar(list(panel.bars), [round(v, 3) for v in panel.bars.values()]))
        fig.label(panel.xlabel if panel.series else "phase (mean seconds per step)")
        fig.title(panel.title)
        if not color:
            fig.theme("colorless")
        text = str(fig.build())
        out.append(text if color else plt.uncolorize(text))
        if panel.bars:  # the tick labels of narrow bars are dropped: every bar's name and value, in order
            out.append("  " + "  ".join(f"{name} {value:.3g}" for name, value in panel.bars.items()) + "\n")
    fig.clear()
    return "\n".join(out)


def png(panels: list[Panel], path: Path, title: str = "") -> Path:
    """The same panels as one image (matplotlib, headless), two columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as mpl

    cols = 2 if len(panels) > 1 else 1
    rows = max(1, -(-len(panels) // cols))
    fig, axes = mpl.subplots(rows, cols, figsize=(6.5 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        if panel.series:
            for label, (xs, ys) in panel.series.items():
                ax.plot(xs, ys, label=label, marker="." if len(xs) < 30 else None)
            ax.legend(fontsize=7)
        else:
            ax.barh(list(panel.bars), list(panel.bars.values()))
            ax.invert_yaxis()
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    mpl.close(fig)
    return path
