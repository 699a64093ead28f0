"""Quality of the shipped tiny model on the fixed prompt set, and how sampling settings move it.

Runs `vidax.eval.harness.evaluate_prompts` on `vidax.data.EVAL_PROMPTS` x seeds with the
shipped weights (one load, reused), prints the metric table (mean ± std) with the rendered
ground truth and its VAE round trip as reference columns, and writes the contact sheet. With
`--sweep`, it then scores a few sampler settings side by side on the same prompts and seeds and
prints each one's caption adherence relative to the default settings.

    python benchmarks/quality.py                        # full table, 2 seeds per prompt
    python benchmarks/quality.py --seeds 1 --prompts 8 --sweep
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from vidax.data import EVAL_PROMPTS
from vidax.eval.harness import evaluate_prompts, format_table, write_report
from vidax.models.registry import get

SWEEP = (
    {"guidance": 1.0},
    {"guidance": 2.5},
    {"guidance": 6.0},
    {"steps": 10},
    {"steps": 40},
    {"sampler": "euler"},
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(EVAL_PROMPTS))
    parser.add_argument("--out", default="runs/quality")
    parser.add_argument("--sweep", action="store_true", help="also compare sampler settings")
    args = parser.parse_args()

    spec = get(args.model)
    transformer = spec.load()
    vae = spec.load_vae()
    prompts = EVAL_PROMPTS[: args.prompts]
    report = evaluate_prompts(
        args.model,
        prompts=prompts,
        seeds=args.seeds,
        transformer=transformer,
        vae=vae,
        references=True,
    )
    paths = write_report(report, args.out)
    print(
        f"{args.model}: {len(report.samples)} videos ({len(prompts)} prompts x {args.seeds} "
        f"seeds) in {report.seconds:.0f}s, settings {report.settings}"
    )
    print(format_table(report))
    print(f"contact sheet: {paths['contact_sheet']}")
    if not args.sweep:
        return
    base = report.summary()
    print("\nsetting | caption_adherence | vs default | motion adherence | s/video")
    print(
        f"default | {base['caption_adherence'].mean:.3f} | 1.00 | "
        f"{base['caption_motion_adherence'].mean:.3f} | "
        f"{report.seconds / len(report.samples):.1f}"
    )
    for change in SWEEP:
        start = time.perf_counter()
        other = evaluate_prompts(
            args.model,
            prompts=prompts,
            seeds=args.seeds,
            transformer=transformer,
            vae=vae,
            **change,
        )
        s = other.summary()
        ratio = s["caption_adherence"].mean / max(base["caption_adherence"].mean, 1e-9)
        print(
            f"{change} | {s['caption_adherence'].mean:.3f} | {ratio:.2f} | "
            f"{s['caption_motion_adherence'].mean:.3f} | "
            f"{(time.perf_counter() - start) / len(other.samples):.1f}"
        )


if __name__ == "__main__":
    main()
