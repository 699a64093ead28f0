"""VAE round trips side by side: how much of each caption survives encode -> decode.

For each VAE (the shipped `tiny` one and any recipe output folders given), the ground-truth
clips of the fixed prompt set and of fresh random draws (`vidax.data.random_eval_prompts`) are
encoded and decoded at several frame sizes and scored with `vidax.metrics.evaluate`: caption
adherence (objects of the right colour and shape where the caption puts them), PSNR, and
subject consistency. The generator can do no better than its VAE's round trip, so this is the
ceiling of `vidax eval` at each size.

    python benchmarks/vae_round_trip.py                                  # shipped VAE only
    python benchmarks/vae_round_trip.py --vae runs/tiny-v2 --random 24   # + a recipe's VAE
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import numpy as np

from vidax.data import EVAL_PROMPTS, random_eval_prompts
from vidax.data.shapes import render
from vidax.metrics import evaluate, psnr
from vidax.models import wan_vae
from vidax.models.registry import ASSETS


def load(folder: Path | None):
    """(name, VAE): the shipped tiny VAE (None) or a recipe folder's, with its stats."""
    preset = wan_vae.PRESETS["shapes"]
    if folder is None:
        return "shipped", wan_vae.load(ASSETS / "tiny" / "vae.safetensors", preset)
    stats = json.loads((folder / "latent_stats.json").read_text())
    config = dataclasses.replace(
        preset, latents_mean=tuple(stats["mean"]), latents_std=tuple(stats["std"])
    )
    return str(folder), wan_vae.load(folder / "vae.safetensors", config)


def score(vae, prompts, frames: int, height: int, width: int) -> dict[str, float]:
    adherence, consistency, psnrs = [], [], []
    for prompt in prompts:
        clip, _ = render(prompt.spec, frames, height, width)
        recon = np.asarray(vae.decode(vae.encode(jnp.asarray(clip)[None]))[0])
        recon = np.clip(recon, -1.0, 1.0)
        metrics = evaluate(recon, prompt.caption)
        adherence.append(metrics["caption_adherence"])
        consistency.append(metrics["subject_consistency"])
        psnrs.append(float(psnr(recon, clip)))
    return {
        "caption_adherence": float(np.mean(adherence)),
        "subject_consistency": float(np.mean(consistency)),
        "psnr": float(np.mean(psnrs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vae", type=Path, action="append", default=[], help="recipe folder")
    parser.add_argument("--random", type=int, default=24, help="random draws (seed 0)")
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument(
        "--sizes", default="64x64,48x64,32x32", help="comma-separated HxW frame sizes"
    )
    args = parser.parse_args()
    vaes = [load(None), *(load(f) for f in args.vae)]
    sets = {"fixed": EVAL_PROMPTS, f"random {args.random}": random_eval_prompts(args.random, 0)}
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print("| VAE | prompts | size | caption_adherence | subject_consistency | PSNR dB |")
    print("|---|---|---|---|---|---|")
    for name, vae in vaes:
        for label, prompts in sets.items():
            for height, width in sizes:
                r = score(vae, prompts, args.frames, height, width)
                print(
                    f"| {name} | {label} | {height}x{width} | {r['caption_adherence']:.3f} | "
                    f"{r['subject_consistency']:.3f} | {r['psnr']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
