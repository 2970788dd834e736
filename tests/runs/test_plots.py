"""Which panels a run gets (by trainer family, or `--metric` globs) and that both renderers draw them."""

from __future__ import annotations

from rlkit.runs.plots import build_panels, missing_metrics, png, terminal, timing_bars

RL_ROWS = [{"step": 0, "val/a/score/mean@1": 0.1}] + [
    {"step": s, "critic/score/mean": 0.1 * s, "actor/pg_loss": -0.01 * s, "actor/entropy": 2.0 - 0.1 * s,
     "timing_s/step": 2.0, "timing_s/gen": 1.5, "timing_s/update_actor": 0.4, "memory/worker/rss_peak_gb": 1.0 + s}
    for s in range(1, 5)
]
DPO_ROWS = [{"step": s, "train/loss": 0.7 - 0.1 * s, "train/rewards/accuracies": 0.5 + 0.1 * s,
             "train/rewards/margins": 0.1 * s} for s in range(1, 4)]


def test_rl_panels_follow_the_trainer_and_add_memory_and_phase_times():
    titles = [p.title for p in build_panels([("run", RL_ROWS)], "grpo")]
    assert titles == ["reward and validation score", "entropy", "loss", "memory per process (GB)",
                      "seconds per step by phase"]
    assert timing_bars(RL_ROWS) == {"gen": 1.5, "update_actor": 0.4}  # the step's total left out


def test_dpo_panels_and_metric_globs_and_compare_labels():
    assert [p.title for p in build_panels([("r", DPO_ROWS)], "dpo")] == ["loss", "accuracy", "margins"]
    panels = build_panels([("a", RL_ROWS), ("b", RL_ROWS)], "grpo", ["actor/*"])
    assert [p.title for p in panels] == ["actor/*"] and set(panels[0].series) == {
        "a: actor/pg_loss", "a: actor/entropy", "b: actor/pg_loss", "b: actor/entropy"}
    assert missing_metrics([RL_ROWS], ["actor/*", "nope*"]) == ["nope*"]
    text = terminal(panels, width=80, height=12)  # four series: the plot grows until the legend fits
    assert all(label in text for label in panels[0].series), text


def test_terminal_and_png_draw_the_same_panels(tmp_path):
    from PIL import Image

    panels = build_panels([("run", RL_ROWS)], "grpo")
    text = terminal(panels, width=70, height=12)
    assert "critic/score/mean" in text and "┤" in text and "step" in text and "gen 1.5" in text
    assert "\x1b[" not in text  # no colour codes unless asked
    with Image.open(png(panels, tmp_path / "p.png")) as img:
        assert img.format == "PNG" and img.size[0] > 600
