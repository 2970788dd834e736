"""A synthetic visual task whose answers need the image; nothing to download.

Each row is one small picture of coloured shapes (PNG bytes in verl's `images` column) and one question about
it: how many shapes (1-3), what colour the shape is, or whether it is left or right. The answer is one word
scored by exact match (`shapes` scorer, data_source `rlkit/shapes`), so a model that ignores the image scores
at chance: 1/3 for count, 1/4 for colour, 1/2 for position. Every word is in the tiny VLM's vocabulary
(`rlkit.testing.build_tiny_vlm_processor`).

Each shape fills one quadrant, so on a 56 px picture (4 image tokens after the 2x2 merge) one token in four
shows it. `--fill` (colour questions) draws the one shape centred across the whole picture instead: every image
token shows the colour, which a random tiny VLM learns to read within a few dozen GRPO steps (the CPU learning
test and recipe); in quadrants it takes several times longer.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from data_prep import options as opt
from data_prep.registry import DATASETS
from data_prep.runner import run
from data_prep.sources import Resolved, SplitRecords
from rlkit.data.images import PLACEHOLDER
from rlkit.data.schema import arrow_schema

DATA_SOURCE = "rlkit/shapes"
SCHEMA = arrow_schema(images=True)
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
KINDS = ("circle", "square", "triangle")
QUESTIONS = {
    "count": "how many shapes ?",
    "colour": "what colour is the shape ?",
    "position": "is the shape left or right ?",
}
SPLIT_STREAMS = {"train": 0, "test": 1}


def draw(shapes: list[dict[str, Any]], size: int) -> bytes:
    """PNG bytes of `shapes` (kind, colour, centre x/y and half-width `r` in [0, 1] of the side) on a white
    square of `size` pixels."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(img)
    for s in shapes:
        x, y, fill = int(s["x"] * size), int(s["y"] * size), COLOURS[s["colour"]]
        r = int(s["r"] * size) - 1
        if s["kind"] == "circle":
            pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif s["kind"] == "square":
            pen.rectangle((x - r, y - r, x + r, y + r), fill=fill)
        else:
            pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def generate(split: str, size: int, kinds: list[str], seed: int, fill: bool = False) -> SplitRecords:
    """`size` records; `fill`: the one shape centred and spanning the picture (colour questions only)."""
    rng = np.random.default_rng([seed, SPLIT_STREAMS[split]])
    records = []
    for i in range(size):
        kind = kinds[i % len(kinds)]
        count = int(rng.integers(1, 4)) if kind == "count" else 1
        slots = rng.permutation(4)[:count]  # quadrants, so shapes never overlap
        shapes = [{"kind": KINDS[int(rng.integers(len(KINDS)))], "colour": list(COLOURS)[int(rng.integers(4))],
                   "x": 0.25 + 0.5 * (q % 2), "y": 0.25 + 0.5 * (q // 2), "r": 0.25} for q in slots]
        if fill:
            shapes[0].update(x=0.5, y=0.5, r=0.5)
        answer = {"count": str(count), "colour": shapes[0]["colour"],
                  "position": "left" if shapes[0]["x"] < 0.5 else "right"}[kind]
        records.append((i, {"question": kind, "shapes": shapes, "answer": answer}))
    out = SplitRecords(split)
    out.add(f"generated:{split}", records)
    return out


def make_row(record: dict[str, Any], split: str, index: int, image_size: int = 56,
             blank: bool = False, no_image: bool = False) -> dict[str, Any]:
    """`blank`: the picture white; `no_image`: no picture and no placeholder (the question as text only)."""
    question = QUESTIONS[record["question"]]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question if no_image else f"{PLACEHOLDER} {question}"}],
        "ability": "vision",
        "reward_model": {"style": "rule", "ground_truth": record["answer"]},
        "extra_info": {"split": split, "index": index},
        "images": [] if no_image else [{"bytes": draw([] if blank else record["shapes"], image_size), "path": None}],
    }


@DATASETS.register("shapes")
def command(
    out: opt.Out = Path("~/data/shapes"),
    questions: Annotated[str, typer.Option("--questions", help="Comma-separated kinds: count,colour,position.")] = (
        "count,colour,position"),
    image_size: Annotated[int, typer.Option("--image-size", min=28, help="Image side in pixels.")] = 56,
    train_size: Annotated[int, typer.Option("--train-size", min=1, help="Rows in train.parquet.")] = 2048,
    test_size: Annotated[int, typer.Option("--test-size", min=1, help="Rows in test.parquet.")] = 128,
    blank: Annotated[bool, typer.Option("--blank", help="Control: the same rows with empty (white) images, so "
                                        "only a model that reads the image can beat chance.")] = False,
    fill: Annotated[bool, typer.Option("--fill", help="Colour questions only: one shape centred across the whole "
                                       "picture instead of in a quadrant, so every image token shows its colour "
                                       "(the easiest task: the CPU learning test and recipe).")] = False,
    no_image: Annotated[bool, typer.Option("--no-image", help="The same questions as text only, without a "
                                           "picture: the step-time baseline of a text-only run (scores chance)."
                                           )] = False,
    limit: opt.Limit = None,
    seed: opt.Seed = 0,
    force: opt.Force = False,
) -> None:
    """Synthetic visual questions (count, colour, position of coloured shapes) with exact-match rewards.

    Example: [bold]rlkit data shapes --out /tmp/shapes --questions colour --fill[/bold]
    """
    kinds = [q.strip() for q in questions.split(",") if q.strip()]
    unknown = [q for q in kinds if q not in QUESTIONS]
    if unknown or not kinds:
        raise typer.BadParameter(f"unknown question kind(s) {unknown}; choose from {', '.join(QUESTIONS)}")
    if fill and kinds != ["colour"]:
        raise typer.BadParameter(f"--fill draws one centred shape: it fits --questions colour only, not "
                                 f"{','.join(kinds)}; drop --fill or ask colour questions")
    if blank and no_image:
        raise typer.BadParameter("--blank (white pictures) and --no-image (no pictures) exclude each other; pick one")
    splits = {s: generate(s, n, kinds, seed, fill) for s, n in {"train": train_size, "test": test_size}.items()}
    resolved = Resolved(splits, f"generated ({','.join(kinds)}, {image_size}px, seed={seed}{', fill' * fill}"
                                f"{', blank' * blank}{', no image' * no_image})")
    run(dataset="shapes", resolved=resolved,
        make_row=lambda r, s, i: make_row(r, s, i, image_size, blank, no_image),
        schema=SCHEMA,
        opts=opt.PrepOptions(out=out, limit=limit, seed=seed, force=force))
