"""Is a DiT resolution-consistent? The test that decides whether DVG may reduce space.

DVG's reduced stages assume the model denoises a coarse grid the way it denoises the full one.
For each prompt: sample the full-resolution video's clean latent x* with the preset's sampler,
noise it to sigma, restrict the noisy latent to a reduced grid (DVG's own operators: nested
frames in time, a DCT low-pass in space) and rescale it to flow form at the lower noise level
the restriction leaves (`vidax.dvg.schedule`'s resolution-dependent shift), then compare the
model's clean prediction there with the restriction of its full-resolution prediction:

    error = |x0(reduced) - restrict(x0(full))|^2 / |restrict(x0(full))|^2

(conditional predictions, no CFG; RoPE positions on full-resolution coordinates, DVG's
default). docs/dvg.md §6.4 measured this on the first tiny DiT (space /2 at sigma 0.6: 0.24);
`ModelSpec.dvg_spatial` can be True where space /2 stays below ~0.10.

    python benchmarks/dvg_consistency.py --model tiny --limit 8
    python benchmarks/dvg_consistency.py --model tiny --weights runs/tiny-v2
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from vidax import pipeline
from vidax.data import EVAL_PROMPTS
from vidax.dvg.transition import axis_operators, downsample, positions
from vidax.models.registry import get
from vidax.models.weights import load_text_encoder
from vidax.text import embed_prompts

GRIDS = {"time /2": (2, 1), "time /4": (4, 1), "space /2": (1, 2), "space /4": (1, 4)}
SIGMAS = (0.95, 0.8, 0.6, 0.4)


def noise_scale(latent: tuple[int, int, int], factors: tuple[int, int]) -> float:
    """Std of white unit noise after `downsample` (the mean squared row norm of its operators)."""
    ops = [
        axis_operators(n, f, axis, method)
        for n, f, axis, method in zip(
            latent,
            (factors[0], factors[1], factors[1]),
            ("time", "space", "space"),
            ("linear", "dct", "dct"),
            strict=True,
        )
    ]
    return math.sqrt(math.prod(float(np.mean(np.sum(o.data**2, axis=1))) for o in ops))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--weights", type=Path, help="weights folder (vidax eval --weights)")
    parser.add_argument("--limit", type=int, default=8, help="first N fixed prompts")
    parser.add_argument("--frames", type=int, help="video frames (default: the preset's)")
    parser.add_argument(
        "--rope",
        choices=("scaled", "compact"),
        default="scaled",
        help="RoPE positions of a reduced grid (`vidax.dvg.plan`'s rope): full-resolution "
        "coordinates, or the reduced grid's own integers (what a model trained at that size saw)",
    )
    args = parser.parse_args()
    spec = get(args.model)
    text_encoder = None
    if args.weights is not None:
        from vidax.models.weights import load_folder

        transformer, _, text_encoder = load_folder(get(args.model), args.weights)
    else:
        transformer = spec.load()
        if spec.text_config is not None:
            text_encoder = load_text_encoder(spec)
    patch = spec.config.patch_size

    @jax.jit
    def x0_prediction(x, sigma, context, pos):
        t = jnp.full((x.shape[0],), 1000.0, jnp.float32) * sigma
        return x - sigma * transformer(x, t, context, positions=pos)

    errors = {name: {s: [] for s in SIGMAS} for name in GRIDS}
    for i, prompt in enumerate(EVAL_PROMPTS[: args.limit]):
        video = pipeline.generate(
            spec,
            prompt.caption,
            seed=prompt.seed,
            num_frames=args.frames,
            transformer=transformer,
            text_encoder=text_encoder,
            decode_frames=False,
        )
        clean = jnp.asarray(video.latents)
        latent = tuple(clean.shape[1:4])
        context = embed_prompts(spec, [prompt.caption], text_encoder=text_encoder).embeds
        eps = jax.random.normal(jax.random.key(i), clean.shape, jnp.float32)
        full_grid = tuple(n // p for n, p in zip(latent, patch, strict=True))
        full_pos = jnp.asarray(positions(full_grid, (1, 1), patch))
        for sigma in SIGMAS:
            x = (1 - sigma) * clean + sigma * eps
            full = x0_prediction(x, jnp.float32(sigma), context, full_pos)
            for name, factors in GRIDS.items():
                s = noise_scale(latent, factors)
                # (1 - sigma) x0 + sigma s n, rescaled to flow form (1 - sigma') x0 + sigma' n.
                scale = (1 - sigma) + sigma * s
                reduced_sigma = sigma * s / scale
                x_r = downsample(x, factors) / scale
                grid = tuple(n // p for n, p in zip(x_r.shape[1:4], patch, strict=True))
                # "compact": the reduced grid's own integer positions (factors (1, 1)).
                scale_by = factors if args.rope == "scaled" else (1, 1)
                pos = jnp.asarray(positions(grid, scale_by, patch))
                pred = x0_prediction(x_r, jnp.float32(reduced_sigma), context, pos)
                target = downsample(full, factors)
                err = jnp.sum((pred - target) ** 2) / jnp.sum(target**2)
                errors[name][sigma].append(float(err))
        print(f"{prompt.name} done", flush=True)
    print(
        f"\nmodel {args.model}, {args.limit} prompts, latent {latent}, rope {args.rope}: "
        "relative squared error of x0 predictions"
    )
    print("| grid | " + " | ".join(f"sigma {s}" for s in SIGMAS) + " |")
    print("|---|" + "---|" * len(SIGMAS))
    for name, by_sigma in errors.items():
        cells = " | ".join(f"{np.mean(v):.3f}" for v in by_sigma.values())
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
