"""Do trained sparse weights beat the training-free baseline? The shipping gate of issue 18.

Three rollouts of a causal preset from the same prompts and noise, scored with the metric suite
(`vidax.metrics`: subject consistency and motion fidelity higher is better, temporal flicker
lower), over the whole rollout and its last quarter, at the short length and 4x / 12x:

- `dense`: the dense Self-Forcing weights with the dense config (the quality reference);
- `free`: the same dense weights with the sparse config, sparse heads at zero (training-free
  sparsity: the dense layer restricted to the selection);
- `trained`: the candidate sparse weights with the sparse config.

Sparse weights ship only if `trained` beats `free` on the long rollouts (4x and 12x): subject
consistency and flicker (whole rollout) no worse in both, better in at least one.

`--distance N` also prints the sparse stage's own objective on held-out rollouts of the gate's
prompts: the mean squared distance of the exit-step prediction to the dense model's over the same
self-generated past (`vidax.forcing.train.self_forcing_loss`), for `free` and `trained` with the
same N noise keys, paired: whether training reduced what it optimises, apart from whether that
helps the rollouts.

    JAX_PLATFORMS=cpu python benchmarks/sparse_training_gate.py --sparse runs/x/sparse/weights.safetensors
    python benchmarks/sparse_training_gate.py --models dense,free --prompts 16 --lengths 4x,12x
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax.data import EVAL_PROMPTS
from vidax.forcing import CausalWan, generate_latents, load
from vidax.forcing.train import self_forcing_loss
from vidax.metrics import motion_fidelity, subject_consistency, temporal_flicker
from vidax.models.registry import get_causal
from vidax.models.weights import load_vae
from vidax.text import embed_prompts

LENGTHS = {"short": 1, "4x": 4, "12x": 12}
METRICS = ("subject_consistency", "temporal_flicker", "motion_fidelity")


def _prompts(n: int):
    """`n` evaluation prompts, one category after another."""
    by_category: dict[str, list] = {}
    for p in EVAL_PROMPTS:
        by_category.setdefault(p.category, []).append(p)
    rows = list(zip(*by_category.values(), strict=False))
    return [p for row in rows for p in row][:n]


def _scores(video: np.ndarray, caption: str) -> dict[str, float]:
    return {
        "subject_consistency": subject_consistency(video),
        "temporal_flicker": temporal_flicker(video),
        "motion_fidelity": motion_fidelity(video, caption),
    }


def beats(trained: dict, free: dict) -> bool:
    """The gate: on the whole 4x and 12x rollouts, subject consistency and flicker no worse,
    and at least one of the four strictly better."""
    cells = [
        (trained[(n, "whole")][m], free[(n, "whole")][m], m == "subject_consistency")
        for n in ("4x", "12x")
        for m in ("subject_consistency", "temporal_flicker")
    ]
    no_worse = all((t >= f) if hi else (t <= f) for t, f, hi in cells)
    better = any((t > f) if hi else (t < f) for t, f, hi in cells)
    return no_worse and better


def distances(models, context, layouts, *, keys: int, seed: int, chunks: int, hw, channels):
    """Per key, each model's self-rollout distance to the dense model (the sparse stage's loss:
    the dense model as its own teacher, one Euler step, i.e. its exit-step prediction)."""
    dense_model, _ = models["dense"]
    teacher = nnx.state(dense_model)
    out = {}
    for name in ("free", "trained"):
        model, _ = models[name]
        graphdef, params = nnx.split(model)
        loss = jax.jit(
            lambda p, k, graphdef=graphdef, layout=layouts[name]: self_forcing_loss(
                graphdef, p, teacher, context, k, layout, layouts["dense"], num_chunks=chunks,
                teacher_steps=1, latent_hw=hw, channels=channels,
            )[0]
        )  # fmt: skip
        out[name] = np.array(
            [float(loss(params, jax.random.key(seed + 1000 + i))) for i in range(keys)]
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-causal")
    p.add_argument("--dense", default=None, help="dense weights (default: the shipped ones)")
    p.add_argument("--sparse", default=None, help="candidate sparse weights (the trained row)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--short-chunks", type=int, default=7)
    p.add_argument("--lengths", default="short,4x,12x")
    p.add_argument("--seed", type=int, default=2, help="noise key of the rollouts")
    p.add_argument(
        "--distance",
        type=int,
        default=0,
        metavar="N",
        help="also the distance to dense over N held-out noise keys (free vs trained)",
    )
    p.add_argument("--distance-chunks", type=int, default=11, help="chunks of those rollouts")
    p.add_argument(
        "--models", default="dense,free,trained", help="rows to run (dense, free, trained)"
    )
    args = p.parse_args()

    preset = get_causal(args.model)
    spec = preset.spec
    dense_path = args.dense or preset.weights_path("dense")
    if dense_path is None:
        raise SystemExit(f"{preset.name!r} ships no dense weights: pass --dense")
    d = spec.defaults
    _, h, w, c = spec.geometry().latent_shape(1, d.height, d.width)
    dense: CausalWan = load(dense_path, spec.config)
    wanted = args.models.split(",")
    rows = {
        "dense": (dense, preset.forcing("dense")),
        "free": (dense, preset.forcing("sparse")),
    }
    if "trained" in wanted or args.distance:
        if args.sparse is None:
            raise SystemExit(
                "the trained row and --distance need --sparse FILE (or --models dense,free)"
            )
        rows["trained"] = (load(args.sparse, spec.config), preset.forcing("sparse"))
    every = rows
    rows = {name: row for name, row in rows.items() if name in wanted}
    vae = load_vae(spec, None)
    prompts = _prompts(args.prompts)
    text = embed_prompts(spec, [q.caption for q in prompts])
    context = text.embeds * text.mask[..., None].astype(text.embeds.dtype)
    print(f"# sparse training gate: {preset.name}, {len(prompts)} prompts, noise key {args.seed}")
    print(
        f"#   dense weights {dense_path}"
        + (f"; trained sparse weights {args.sparse}" if "trained" in rows else "")
    )
    if args.distance:
        layouts = {name: m.layout(f, (h, w)) for name, (m, f) in every.items()}
        dist = distances(
            every, jnp.asarray(context), layouts, keys=args.distance, seed=args.seed,
            chunks=args.distance_chunks, hw=(h, w), channels=c,
        )  # fmt: skip
        diff = dist["trained"] - dist["free"]
        print(
            f"distance to dense ({args.distance_chunks}-chunk self-rollouts, {args.distance} "
            f"held-out keys): free {dist['free'].mean():.5f}, trained "
            f"{dist['trained'].mean():.5f}; trained - free {diff.mean():+.5f} "
            f"(+- {diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else 0:.5f}), "
            f"lower in {int((diff < 0).sum())} of {len(diff)}",
            flush=True,
        )
    print("mean over prompts; whole rollout | last quarter")
    print(f"{'length':6s} {'model':8s}" + "".join(f"{m:>28s}" for m in METRICS))
    results: dict[str, dict] = {name: {} for name in rows}
    for length in args.lengths.split(","):
        n = args.short_chunks * LENGTHS[length]
        for name, (model, forcing) in rows.items():
            start = time.time()
            layout = model.layout(forcing, (h, w))
            lat = generate_latents(
                model, jax.random.key(args.seed), context, layout, n, latent_hw=(h, w), channels=c
            )
            frames = np.asarray(vae.decode(lat))
            whole = [_scores(frames[i], q.caption) for i, q in enumerate(prompts)]
            tail = frames.shape[1] // 4
            last = [_scores(frames[i, -tail:], q.caption) for i, q in enumerate(prompts)]
            for part, scored in (("whole", whole), ("last", last)):
                results[name][(length, part)] = {
                    m: float(np.mean([s[m] for s in scored])) for m in METRICS
                }
            cells = "".join(
                f"{results[name][(length, 'whole')][m]:>13.4f} | "
                f"{results[name][(length, 'last')][m]:<12.4f}"
                for m in METRICS
            )
            print(f"{length:6s} {name:8s}{cells}  ({time.time() - start:.0f} s)", flush=True)
    if "12x" in args.lengths.split(",") and "dense" in rows:
        # Issue 18's quality target: at 12x, subject consistency and flicker no worse than
        # dense, better in the last quarter.
        print(
            "\n12x against dense (issue 18: no worse over the whole rollout, better in its last quarter):"
        )
        for name in (n for n in rows if n != "dense"):
            cells = []
            for m, hi in (("subject_consistency", True), ("temporal_flicker", False)):
                for part in ("whole", "last"):
                    got, ref = results[name][("12x", part)][m], results["dense"][("12x", part)][m]
                    better, worse = (got > ref, got < ref) if hi else (got < ref, got > ref)
                    verdict = "better" if better else ("worse" if worse else "equal")
                    cells.append(f"{m} {part} {got:.5f} vs {ref:.5f} {verdict}")
            print(f"  {name:8s}" + "; ".join(cells))
    if {"4x", "12x"} <= set(args.lengths.split(",")) and {"free", "trained"} <= set(rows):
        verdict = beats(results["trained"], results["free"])
        print(f"\ntrained beats training-free on the long rollouts: {'yes' if verdict else 'no'}")


if __name__ == "__main__":
    main()
