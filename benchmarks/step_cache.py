"""The step cache against the full sampler, fewer steps at equal forwards, and DVG, on `tiny`.

For each prompt of the fixed set (first N) at the model's default size and 20 steps: the full
sampler, `--accel cache` at several kept fractions, plain sampling with as many steps as the
cache runs forwards (the naive way to spend the same compute), DVG (temporal, budget 0.4) and
DVG with the cache. Every row is measured in this one run: wall-clock of the denoising (median
over prompts, compiled programs warm: each configuration runs once before timing), model
forwards, the latent's relative L1 distance from the full sampler's, PSNR of the decoded frames
against the full sampler's, and caption adherence. The calibration (a full run of the first
prompt, untimed) goes to a temporary folder and serves every prompt.

    python benchmarks/step_cache.py                  # 8 prompts
    python benchmarks/step_cache.py --prompts 35 --seed 1
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from vidax import pipeline
from vidax.data import EVAL_PROMPTS
from vidax.metrics import caption_adherence, psnr
from vidax.models import get

STEPS = 20
KEEPS = (0.8, 0.6, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault(pipeline.ENV_STEP_CACHE, tempfile.mkdtemp(prefix="vidax-step-cache-"))
    spec = get(args.model)
    transformer, vae = spec.load(), spec.load_vae()
    prompts = EVAL_PROMPTS[: args.prompts]
    base = dict(steps=STEPS, transformer=transformer, vae=vae, seed=args.seed)

    def run(prompt, **kw):
        return pipeline.generate(spec, prompt.caption, **{**base, **kw})

    # The calibration is per model, size and schedule (not per prompt): the first prompt's.
    run(prompts[0], accel="cache")
    fulls = {p.caption: run(p) for p in prompts}
    rows: list[tuple[str, dict]] = [("full", {})]
    for keep in KEEPS:
        skipped = run(prompts[0], accel="cache", budget=keep).step_cache.skipped
        if f"fewer steps ({STEPS - skipped})" in dict(rows):
            continue  # the plan's rules allow no more skips: the same run as the row above
        rows.append((f"cache keep {keep}", {"accel": "cache", "budget": keep}))
        rows.append((f"fewer steps ({STEPS - skipped})", {"steps": STEPS - skipped}))
    rows.append(("dvg temporal 0.4", {"accel": "temporal", "budget": 0.4}))
    rows.append(("dvg+cache 0.4", {"accel": "dvg+cache", "budget": 0.4}))

    table = []
    for name, kw in rows:
        run(prompts[0], **kw)  # compile (the persistent cache may already have it)
        measured, forwards = [], kw.get("steps", STEPS)
        for prompt in prompts:
            video, full = run(prompt, **kw), fulls[prompt.caption]
            if video.step_cache is not None:
                forwards = STEPS - video.step_cache.skipped
            frames, reference = video.frames * 2 - 1, full.frames * 2 - 1
            measured.append(
                (
                    video.denoise_seconds,
                    np.abs(video.latents - full.latents).mean() / np.abs(full.latents).mean(),
                    psnr(frames, reference),
                    caption_adherence(frames, prompt.caption),
                )
            )
        table.append((name, forwards, np.asarray(measured, np.float64)))
    full_time = np.median(table[0][2][:, 0])
    print(f"{args.model}, {len(prompts)} prompts, {STEPS} steps, seed {args.seed}")
    print(
        "| run | forwards | speed-up (median wall) | latent rel. L1 | PSNR vs full | caption adh. |"
    )
    print("|---|---|---|---|---|---|")
    for name, forwards, m in table:
        print(
            f"| {name} | {forwards} | {full_time / np.median(m[:, 0]):.2f}x | {m[:, 1].mean():.3f} "
            f"| {m[:, 2].mean():.1f} dB | {m[:, 3].mean():.3f} |"
        )


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
