"""The evaluation harness: prompts x seeds -> generated videos -> metric table + contact sheet.

    report = evaluate_prompts("tiny", seeds=2)
    print(format_table(report))
    write_report(report, "runs/eval")   # table.md, results.json, contact_sheet.png

    fresh = evaluate_prompts("tiny", prompts=vidax.data.random_eval_prompts(8), label="random 8")
    write_report([report, fresh], "runs/eval")   # both sets, each under its label

Each (prompt, seed) video is exactly what `vidax generate --prompt <caption> --seed <seed>`
renders, judged against its caption by `vidax.metrics.evaluate`. Optional reference rows
score the rendered ground truth and its VAE round trip through the same metrics, which bounds
what the generator can reach and separates VAE errors from diffusion errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageDraw

from vidax import pipeline
from vidax.data import read_prompt
from vidax.data.shapes import EVAL_PROMPTS, SHAPES, EvalPrompt, render
from vidax.forcing.command import check
from vidax.forcing.rollout import generate_latents
from vidax.forcing.weights import load_causal
from vidax.metrics.evaluate import Summary, evaluate, summarise
from vidax.metrics.scene import shapes_read
from vidax.models.registry import get, get_causal, is_causal
from vidax.models.weights import load_text_encoder
from vidax.text import embed_prompts

# Metrics shown in the table, in order (higher is better unless marked).
TABLE_METRICS = (
    "caption_adherence",
    "caption_motion_adherence",
    "motion_fidelity",
    "subject_consistency",
    "motion_magnitude",
    "temporal_flicker",
    "flicker_score",
)
# Rows added for causal (long, chunk-by-chunk) videos: the metrics of their last quarter, where
# a rollout drifts if it does.
LAST_QUARTER_METRICS = ("last_quarter_caption_adherence", "last_quarter_subject_consistency")
_SEED_STRIDE = 100_000  # seed of replicate k of a prompt: prompt.seed + k * stride


@dataclasses.dataclass(frozen=True)
class Sample:
    """One evaluated video: which prompt and seed, its metrics, and its frames in [0, 1]."""

    prompt: EvalPrompt
    seed: int
    metrics: dict[str, float]
    frames: np.ndarray  # (t, h, w, 3) float32 in [0, 1]


@dataclasses.dataclass(frozen=True)
class Report:
    """The result of `evaluate_prompts`.

    Attributes:
        model: preset name.
        samples: one per (prompt, seed), prompts in order, seeds inner.
        references: {"ground truth": [...], "vae": [...]} reference samples per prompt (may be
            empty).
        settings: generation settings (frames, size, steps, guidance, shift, sampler).
        seconds: wall time of the generation and scoring.
        label: names the prompt set in tables and results.json (e.g. "fixed"); "" for none.
    """

    model: str
    samples: list[Sample]
    references: dict[str, list[Sample]]
    settings: dict[str, Any]
    seconds: float
    label: str = ""

    def summary(self) -> dict[str, Summary]:
        """Mean +- std of every metric over all samples."""
        return summarise(s.metrics for s in self.samples)

    def by_category(
        self, metric: str = "caption_adherence", reference: str | None = None
    ) -> dict[str, Summary]:
        """Mean +- std of one metric per prompt category, over the generated samples or, given
        `reference` (a key of `references`), over that reference's samples."""
        samples = self.samples if reference is None else self.references[reference]
        out = {}
        for category in dict.fromkeys(s.prompt.category for s in samples):
            rows = [s.metrics for s in samples if s.prompt.category == category]
            out[category] = summarise(rows)[metric]
        return out

    @property
    def prompts(self) -> list[EvalPrompt]:
        """The evaluated prompts, in order, once each."""
        return list({s.prompt.name: s.prompt for s in self.samples}.values())

    def shape_confusion(self) -> dict[str, dict[str, int]]:
        """{asked shape: {read shape or "missing": count}} over every caption object of every
        sample: which shapes the generator draws for which words."""
        table = {shape: dict.fromkeys((*SHAPES, "missing"), 0) for shape in SHAPES}
        for s in self.samples:
            for asked, read in shapes_read(s.frames * 2.0 - 1.0, s.prompt.caption):
                table[asked][read or "missing"] += 1
        return table


def prompt_seeds(prompts: Sequence[EvalPrompt], seeds: int) -> list[tuple[EvalPrompt, int]]:
    """The (prompt, seed) pairs of an evaluation: `seeds` replicates of every prompt."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if not prompts:
        raise ValueError("no prompts to evaluate")
    return [(p, p.seed + k * _SEED_STRIDE) for p in prompts for k in range(seeds)]


def evaluate_prompts(
    model: str = "tiny",
    *,
    prompts: Sequence[EvalPrompt] = EVAL_PROMPTS,
    seeds: int = 2,
    transformer=None,
    vae=None,
    text_encoder=None,
    references: bool = False,
    on_sample: Callable[[int, int], None] | None = None,
    label: str = "",
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    shift: float | None = None,
    sampler: str | None = None,
    attention: str = "sparse",
    forcing_overrides: dict[str, Any] | None = None,
) -> Report:
    """Generates every (prompt, seed) video with `vidax.pipeline.generate` and scores it.

    A causal preset (`tiny-causal`) generates chunk by chunk instead, the latents `vidax
    generate --stream --set attention=<attention>` makes for the same prompt and seed, with its
    shipped causal weights (`transformer`: an already-loaded `CausalWan`), its `ForcingConfig`
    edited by `forcing_overrides` (`--set`, e.g. {"guidance": 3.0}); its samples also carry
    `LAST_QUARTER_METRICS`. `guidance` sets its `ForcingConfig.guidance`; `steps`, `shift`,
    `sampler` do not apply to it.

    Args:
        model: preset name (its shipped weights unless `transformer`/`vae` are given).
        prompts: the prompts (default the fixed set `vidax.data.EVAL_PROMPTS`, 35 prompts;
            `vidax.data.random_eval_prompts` draws fresh ones).
        seeds: replicates per prompt; replicate k uses seed `prompt.seed + 100000 k`.
        transformer, vae, text_encoder: already-loaded models (default: the preset's shipped
            weights, loaded once; the text encoder only for presets with a trained one).
        references: also score each prompt's rendered ground truth and its VAE round trip.
        on_sample: progress callback (done, total).
        label: `Report.label`.
        num_frames, height, width, steps, guidance, shift, sampler: overrides for `generate`
            (None: the preset's default). height and width also size the rendered references;
            they must be >= 16 (the renderer) and fit the model's latent geometry.

    Returns:
        A `Report`.
    """
    if is_causal(model):
        if any(x is not None for x in (steps, shift, sampler)):
            raise ValueError(
                f"steps, shift and sampler do not apply to the causal model {model!r} (its own "
                "few-step schedule; guidance sets its ForcingConfig.guidance)"
            )
        if guidance is not None:
            forcing_overrides = {**(forcing_overrides or {}), "guidance": guidance}
        return _evaluate_causal(
            model,
            prompts=prompts,
            seeds=seeds,
            transformer=transformer,
            vae=vae,
            text_encoder=text_encoder,
            references=references,
            on_sample=on_sample,
            label=label,
            num_frames=num_frames,
            height=height,
            width=width,
            attention=attention,
            forcing_overrides=forcing_overrides,
        )
    if forcing_overrides:
        raise ValueError(f"forcing_overrides apply to causal models only, not {model!r}")
    spec = get(model)
    pairs = prompt_seeds(prompts, seeds)
    d = spec.defaults
    # `is None`, not `or`: an explicit 0 (e.g. guidance 0.0) is a setting, not a default.
    num_frames = d.num_frames if num_frames is None else num_frames
    height = d.height if height is None else height
    width = d.width if width is None else width
    settings: dict[str, Any] = {
        "num_frames": num_frames,
        "height": height,
        "width": width,
        "steps": d.steps if steps is None else steps,
        "guidance": d.guidance if guidance is None else guidance,
        "shift": d.shift if shift is None else shift,
        "sampler": d.sampler if sampler is None else sampler,
    }
    # Checked before any weights load or video renders: a bad size fails in a second.
    spec.geometry().latent_shape(num_frames, height, width)
    if min(height, width) < 16:
        raise ValueError(f"height and width must be >= 16, got {height}x{width}")
    start = time.perf_counter()
    if transformer is None:
        transformer = spec.load()
    if vae is None:
        vae = spec.load_vae()
    if vae is None:
        raise ValueError(f"model {model!r} has no VAE: its videos cannot be scored")
    if text_encoder is None and spec.text_config is not None:
        text_encoder = load_text_encoder(spec)

    def video(prompt: EvalPrompt, seed: int) -> np.ndarray:
        out = pipeline.generate(
            spec,
            prompt=prompt.caption,
            seed=seed,
            transformer=transformer,
            vae=vae,
            text_encoder=text_encoder,
            **settings,
        )
        assert out.frames is not None  # decoded: `vae` is given
        return out.frames

    samples = _generate_and_score(pairs, video, on_sample)
    refs = _references(prompts, vae, settings) if references else {}
    return Report(model, samples, refs, settings, time.perf_counter() - start, label)


def _evaluate_causal(
    model: str,
    *,
    prompts: Sequence[EvalPrompt],
    seeds: int,
    transformer,
    vae,
    text_encoder,
    references: bool,
    on_sample: Callable[[int, int], None] | None,
    label: str,
    num_frames: int | None,
    height: int | None,
    width: int | None,
    attention: str,
    forcing_overrides: dict[str, Any] | None,
) -> Report:
    """`evaluate_prompts` for a causal preset: chunk-by-chunk rollouts, batch 1 per video."""
    preset = get_causal(model)
    spec = preset.spec
    d = spec.defaults
    num_frames = preset.num_frames if num_frames is None else num_frames
    height = d.height if height is None else height
    width = d.width if width is None else width
    if min(height, width) < 16:
        raise ValueError(f"height and width must be >= 16, got {height}x{width}")
    # The one-line reasons `vidax generate --stream` gives, before anything loads.
    chunks = check(
        preset,
        frames=num_frames,
        height=height,
        width=width,
        attention=attention,
        forcing_overrides=forcing_overrides,
    )
    forcing = preset.forcing(attention, forcing_overrides)
    settings: dict[str, Any] = {
        "num_frames": num_frames,
        "height": height,
        "width": width,
        "attention": attention,
        "chunks": chunks,
        **(forcing_overrides or {}),
    }
    pairs = prompt_seeds(prompts, seeds)
    start = time.perf_counter()
    causal = transformer if transformer is not None else load_causal(preset, attention)
    vae = vae if vae is not None else spec.load_vae()
    if text_encoder is None and spec.text_config is not None:
        text_encoder = load_text_encoder(spec)
    _, h, w, c = spec.geometry().latent_shape(num_frames, height, width)
    layout = causal.layout(forcing, (h, w))

    def video(prompt: EvalPrompt, seed: int) -> np.ndarray:
        text = embed_prompts(spec, [read_prompt(spec, prompt.caption)], text_encoder=text_encoder)
        context = text.embeds * text.mask[..., None].astype(text.embeds.dtype)
        latents = generate_latents(
            causal, jax.random.key(seed), context, layout, chunks, latent_hw=(h, w), channels=c
        )
        return np.clip((np.asarray(vae.decode(latents))[0] + 1.0) / 2.0, 0.0, 1.0)

    samples = _generate_and_score(pairs, video, on_sample, last_quarter=True)
    refs = _references(prompts, vae, settings) if references else {}
    return Report(model, samples, refs, settings, time.perf_counter() - start, label)


def _generate_and_score(
    pairs: Sequence[tuple[EvalPrompt, int]],
    video: Callable[[EvalPrompt, int], np.ndarray],
    on_sample: Callable[[int, int], None] | None,
    *,
    last_quarter: bool = False,
) -> list[Sample]:
    """`video(prompt, seed)` -> (t, h, w, 3) frames in [0, 1] for every pair, scored."""
    samples = []
    for i, (prompt, seed) in enumerate(pairs):
        samples.append(_score(prompt, seed, video(prompt, seed), last_quarter=last_quarter))
        if on_sample is not None:
            on_sample(i + 1, len(pairs))
    return samples


def _score(
    prompt: EvalPrompt, seed: int, frames: np.ndarray, *, last_quarter: bool = False
) -> Sample:
    metrics = evaluate(frames * 2.0 - 1.0, prompt.caption)
    if last_quarter:
        tail = evaluate(frames[-(frames.shape[0] // 4) :] * 2.0 - 1.0, prompt.caption)
        for name in LAST_QUARTER_METRICS:
            metrics[name] = tail[name.removeprefix("last_quarter_")]
    return Sample(prompt, seed, metrics, np.asarray(frames, np.float32))


def _references(
    prompts: Sequence[EvalPrompt], vae, settings: dict[str, Any]
) -> dict[str, list[Sample]]:
    truth, recon = [], []
    for prompt in prompts:
        frames, _ = render(
            prompt.spec, settings["num_frames"], settings["height"], settings["width"]
        )
        long = "chunks" in settings  # a causal report: its last-quarter rows too
        truth.append(_score(prompt, prompt.seed, (frames + 1.0) / 2.0, last_quarter=long))
        decoded = vae.decode(vae.encode(jnp.asarray(frames)[None]))[0]
        recon.append(
            _score(prompt, prompt.seed, (np.asarray(decoded) + 1.0) / 2.0, last_quarter=long)
        )
    return {"ground truth": truth, "vae": recon}


# ------------------------------------------------------------------------- reporting


def format_table(report: Report | Sequence[Report], metrics: Sequence[str] = TABLE_METRICS) -> str:
    """Markdown tables: mean +- std of each metric for the generator and the references,
    caption adherence per prompt category, and the generator's shape confusion.

    A labelled report's tables follow a "## <label>: ..." heading (prompts, seeds, size,
    frames). Several reports (prompt sets) give their tables in turn, and need distinct labels.
    """
    if not isinstance(report, Report):
        return "\n\n".join(format_table(r, metrics) for r in _labelled(report))
    columns = {"generated": report.summary()}
    for name, rows in report.references.items():
        columns[name] = summarise(s.metrics for s in rows)
    n = {
        k: (len(report.samples) if k == "generated" else len(report.references[k])) for k in columns
    }
    head = "| metric | " + " | ".join(f"{k} (n={n[k]})" for k in columns) + " |"
    lines = [_heading(report), ""] if report.label else []
    lines += [head, "|---" * (len(columns) + 1) + "|"]
    if report.samples and LAST_QUARTER_METRICS[0] in report.samples[0].metrics:
        metrics = (*metrics, *LAST_QUARTER_METRICS)
    for metric in metrics:
        cells = [_cell(columns[k].get(metric)) for k in columns]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    # Reference columns per category bound what the generator can reach in each one.
    refs = {k: report.by_category(reference=k) for k in report.references}
    head = "| category | prompts | caption_adherence | caption_motion_adherence | "
    head += "".join(f"{k}: caption_adherence | " for k in refs)
    lines += ["", head.rstrip(), "|---" * (4 + len(refs)) + "|"]
    motion = report.by_category("caption_motion_adherence")
    prompts = Counter(p.category for p in report.prompts)
    for category, summary in report.by_category("caption_adherence").items():
        cells = [str(prompts[category]), _cell(summary), _cell(motion[category])]
        cells += [_cell(by.get(category)) for by in refs.values()]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    confusion = report.shape_confusion()
    read_as = (*SHAPES, "missing")
    head = "| asked shape, read as: | " + " | ".join(read_as) + " |"
    lines += ["", head, "|---" * (len(read_as) + 1) + "|"]
    for asked, row in confusion.items():
        lines.append(f"| {asked} | " + " | ".join(str(row[r]) for r in read_as) + " |")
    return "\n".join(lines)


def _labelled(reports: Sequence[Report]) -> Sequence[Report]:
    labels = [r.label for r in reports]
    if not reports or (len(reports) > 1 and ("" in labels or len(set(labels)) < len(labels))):
        raise ValueError(f"need one report, or several with distinct labels, got {labels}")
    return reports


def _heading(report: Report) -> str:
    prompts, seeds = len(report.prompts), len(report.samples) // len(report.prompts)
    text = f"## {report.label}: {_count(prompts, 'prompt')} x {_count(seeds, 'seed')}"
    settings = report.settings
    if "height" in settings and "width" in settings:
        text += f", {settings['height']}x{settings['width']}"
    if "num_frames" in settings:
        text += f", {settings['num_frames']} frames"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _cell(summary: Summary | None) -> str:
    if summary is None or summary.n == 0:
        return "-"
    return f"{summary.mean:.3f} ± {summary.std:.3f}"


def contact_sheet(
    report: Report, *, frames: int = 6, scale: int = 2, reference: str | None = "ground truth"
) -> np.ndarray:
    """A uint8 image (H, W, 3): one row per prompt, `frames` evenly spaced frames of each seed
    (and of the `reference` row's video, left), with the caption and the caption adherence.

    Args:
        report: an evaluation report.
        frames: frames shown per video.
        scale: nearest-neighbour upscaling of each frame.
        reference: a key of `report.references` to show first on each row, or None.
    """
    rows: dict[str, list[Sample]] = {}
    for s in report.samples:
        rows.setdefault(s.prompt.name, []).append(s)
    refs = {s.prompt.name: s for s in report.references.get(reference, [])} if reference else {}
    grid = []
    for name, samples in rows.items():
        videos = [("", refs[name].frames)] if name in refs else []
        videos += [
            (f"seed {s.seed}: adherence {s.metrics['caption_adherence']:.2f}", s.frames)
            for s in samples
        ]
        grid.append((f"{name}: {samples[0].prompt.caption}", videos))
    return video_grid(grid, frames=frames, scale=scale)


def video_grid(
    rows: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]],
    *,
    frames: int = 6,
    scale: int = 2,
) -> np.ndarray:
    """A uint8 image (H, W, 3) of labelled videos side by side, a titled row each.

    Args:
        rows: (title, [(label, video), ...]) per row; a video is (T, H, W, 3) in [0, 1], all of
          one shape; an empty label draws none.
        frames: evenly spaced frames shown per video.
        scale: nearest-neighbour upscaling of each frame.
    """
    if frames < 1 or scale < 1:
        raise ValueError(f"frames and scale must be >= 1, got {frames}, {scale}")
    if not rows or not all(videos for _, videos in rows):
        raise ValueError("video_grid needs at least one video in every row")
    shapes = {video.shape for _, videos in rows for _, video in videos}
    if len(shapes) != 1 or len(next(iter(shapes))) != 4:
        raise ValueError(f"video_grid needs videos of one (T, H, W, 3) shape, got {shapes}")
    t, h, w, _ = shapes.pop()
    pick = np.linspace(0, t - 1, frames).round().astype(int)
    tile_h, tile_w = h * scale, w * scale
    gap, text_h = 4, 14
    strip_w = frames * tile_w + gap
    width = max(len(videos) for _, videos in rows) * strip_w + gap
    row_h = tile_h + text_h + gap
    image = Image.new("RGB", (width, len(rows) * row_h + gap), (24, 24, 24))
    draw = ImageDraw.Draw(image)
    for r, (title, videos) in enumerate(rows):
        y = gap + r * row_h
        draw.text((gap, y), title, fill=(230, 230, 230))
        for c, (label, video) in enumerate(videos):
            x0 = gap + c * strip_w
            for k, f in enumerate(pick):
                tile = np.clip(video[f] * 255.0 + 0.5, 0, 255).astype(np.uint8)
                tile = tile.repeat(scale, axis=0).repeat(scale, axis=1)
                image.paste(Image.fromarray(tile), (x0 + k * tile_w, y + text_h))
            if label:
                draw.text((x0 + 2, y + text_h + 2), label, fill=(255, 255, 255))
    return np.asarray(image)


def write_report(report: Report | Sequence[Report], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes table.md, results.json (every sample's metrics) and contact_sheet.png.

    One report gives one record in results.json: model, label, settings, seconds, summary,
    by_category, samples, references. Several reports (prompt sets with distinct labels) give
    {"sets": [record, ...]}, their tables in turn and their contact sheets stacked.
    """
    reports = [report] if isinstance(report, Report) else _labelled(report)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "table": out / "table.md",
        "results": out / "results.json",
        "contact_sheet": out / "contact_sheet.png",
    }
    paths["table"].write_text(format_table(report) + "\n")
    records = [_record(r) for r in reports]
    results = records[0] if isinstance(report, Report) else {"sets": records}
    paths["results"].write_text(json.dumps(results, indent=1, default=float) + "\n")
    iio.imwrite(paths["contact_sheet"], _stack([contact_sheet(r) for r in reports]))
    return paths


def _record(report: Report) -> dict[str, Any]:
    """One report as plain JSON data."""
    sources = {"generated": None, **{k: k for k in report.references}}
    by_category = {
        name: {
            m: {c: v._asdict() for c, v in report.by_category(m, reference=ref).items()}
            for m in ("caption_adherence", "caption_motion_adherence")
        }
        for name, ref in sources.items()
    }
    return {
        "model": report.model,
        "label": report.label,
        "settings": report.settings,
        "seconds": report.seconds,
        "summary": {k: v._asdict() for k, v in report.summary().items()},
        "by_category": by_category,
        "samples": [
            {
                "prompt": s.prompt.name,
                "category": s.prompt.category,
                "caption": s.prompt.caption,
                "seed": s.seed,
                **s.metrics,
            }
            for s in report.samples
        ],
        "references": {
            k: [{"prompt": s.prompt.name, "category": s.prompt.category, **s.metrics} for s in v]
            for k, v in report.references.items()
        },
    }


def _stack(sheets: Sequence[np.ndarray]) -> np.ndarray:
    """Contact sheets one above the other, narrower ones padded with the sheets' background."""
    width = max(s.shape[1] for s in sheets)
    padded = [
        np.pad(s, ((0, 0), (0, width - s.shape[1]), (0, 0)), constant_values=24) for s in sheets
    ]
    return np.concatenate(padded, axis=0)
