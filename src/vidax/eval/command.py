"""CLI: `vidax eval`, scoring a model on the shapes prompts (`vidax.eval.harness`).

vidax eval --model tiny --seeds 2 --out runs/eval
vidax eval --model tiny --weights runs/tiny-v2 --random 48 --seed 7
vidax eval --model tiny-causal --frames 129 --attention dense
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vidax.data import EVAL_PROMPTS, random_eval_prompts
from vidax.eval.harness import evaluate_prompts, format_table, write_report
from vidax.forcing.command import check
from vidax.forcing.weights import load_causal
from vidax.models.registry import get, get_causal, is_causal
from vidax.models.weights import load_folder, load_text_encoder, missing_weights


def register(app: typer.Typer) -> None:
    """Adds `eval` to `app`."""
    app.command("eval")(evaluate)


def evaluate(
    model: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    seeds: Annotated[int, typer.Option(help="Seeds per prompt.")] = 2,
    limit: Annotated[
        int | None, typer.Option(help="Only the first N prompts of the fixed set.")
    ] = None,
    weights: Annotated[
        Path | None,
        typer.Option(help="Folder with transformer.safetensors and vae.safetensors."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where table.md, results.json, PNG go.")] = Path(
        "runs/eval"
    ),
    steps: Annotated[int | None, typer.Option(help="Denoising steps.")] = None,
    guidance: Annotated[float | None, typer.Option(help="CFG scale.")] = None,
    shift: Annotated[float | None, typer.Option(help="Sigma shift.")] = None,
    frames: Annotated[int | None, typer.Option(help="Frames (4k + 1).")] = None,
    references: Annotated[
        bool, typer.Option(help="Also score ground truth and its VAE round trip.")
    ] = True,
    random: Annotated[
        int, typer.Option(help="Also score N fresh draws from the training distribution (0: off).")
    ] = 0,
    seed: Annotated[
        int, typer.Option(help="First seed of the --random draws (vidax.data.random_eval_prompts).")
    ] = 0,
    height: Annotated[
        int | None, typer.Option(help="Render and generate at this height (default: the model's).")
    ] = None,
    width: Annotated[
        int | None, typer.Option(help="Render and generate at this width (default: the model's).")
    ] = None,
    fixed: Annotated[bool, typer.Option(help="Score the fixed prompt set.")] = True,
    attention: Annotated[
        str | None,
        typer.Option(help="Causal models: 'sparse' (Sparse Forcing, the default) or 'dense'."),
    ] = None,
) -> None:
    """Score a model on the fixed prompt set and/or fresh random prompts: metric tables
    (mean ± std, per category, with reference rows) and a contact sheet."""
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if limit is not None and not 1 <= limit <= len(EVAL_PROMPTS):
        raise ValueError(f"--limit must be in [1, {len(EVAL_PROMPTS)}], got {limit}")
    if random < 0 or seed < 0:
        raise ValueError(f"--random and --seed must be >= 0, got {random}, {seed}")
    if not fixed and random == 0:
        raise ValueError("nothing to score: --no-fixed needs --random N with N >= 1")
    for name, size in (("--height", height), ("--width", width)):
        if size is not None and size < 16:
            raise ValueError(f"{name} must be >= 16, got {size}")
    sets = [("fixed", EVAL_PROMPTS[:limit])] if fixed else []
    if random:
        sets.append((f"random {random} from seed {seed}", random_eval_prompts(random, seed)))
    causal = is_causal(model)
    if attention is not None and not causal:
        raise ValueError(f"--attention applies to causal models only, not {model!r}")
    if causal:
        transformer, vae, text_encoder = _causal_parts(
            model, weights, frames, height, width, attention or "sparse"
        )
    else:
        transformer, vae, text_encoder = _parts(model, weights, frames, height, width)
    reports = []
    for label, prompts in sets:

        def progress(i: int, n: int, label: str = label) -> None:
            typer.echo(f"\r{label}: {i}/{n} videos", nl=False, err=True)

        reports.append(
            evaluate_prompts(
                model,
                prompts=prompts,
                seeds=seeds,
                transformer=transformer,
                vae=vae,
                text_encoder=text_encoder,
                references=references,
                on_sample=progress,
                label=label,
                steps=steps,
                guidance=guidance,
                shift=shift,
                num_frames=frames,
                height=height,
                width=width,
                attention=attention or "sparse",
            )
        )
        typer.echo("", err=True)
    report = reports[0] if len(reports) == 1 else reports
    paths = write_report(report, out)
    typer.echo(format_table(report))
    typer.echo(
        f"{sum(len(r.samples) for r in reports)} videos in "
        f"{sum(r.seconds for r in reports):.0f}s; wrote {paths['table']}, "
        f"{paths['results']}, {paths['contact_sheet']}"
    )


def _parts(model: str, weights: Path | None, frames, height, width):
    """(transformer, vae, text encoder) of a text-to-video preset, loaded once for every set."""
    spec = get(model)
    d = spec.defaults
    # Fails on a size or frame count the model cannot take before any weights load.
    spec.geometry().latent_shape(frames or d.num_frames, height or d.height, width or d.width)
    if weights is not None:
        return load_folder(spec, weights)
    if missing := missing_weights(spec, text_encoder=spec.text_config is not None):
        raise ValueError(
            f"model {model!r} ships no weights for its {', '.join(missing)}: pass --weights DIR "
            "(a folder written by `vidax train all` or `vidax train export`)"
        )
    text_encoder = load_text_encoder(spec) if spec.text_config else None
    return spec.load(), spec.load_vae(), text_encoder


def _causal_parts(model: str, weights: Path | None, frames, height, width, attention: str):
    """(causal transformer, vae, text encoder) of a causal preset, loaded once."""
    if weights is not None:
        raise ValueError(f"--weights does not apply to the causal model {model!r}")
    preset = get_causal(model)
    # The one-line reasons `vidax generate --stream` gives, before anything loads.
    check(preset, frames=frames, height=height, width=width, attention=attention)
    spec = preset.spec
    text_encoder = load_text_encoder(spec) if spec.text_config else None
    return load_causal(preset, attention), spec.load_vae(), text_encoder
