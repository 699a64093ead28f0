"""Does the sparse stage's selection gradient point downhill? A check of the straight-through
scored top-k (`vidax.forcing.attention`) on the real, discrete loss.

With `sparse_heads="selection"` only the key compression `compress_k` trains, and it changes the
sparse model only through *which* blocks are selected and kept: the loss is piecewise constant
in it, and its gradient is the surrogate's. This takes that gradient at the zero init (the
training-free model: blocks ranked by their mean key), averaged over `--grad-keys` rollouts,
then evaluates the real loss (the distance of the exit-step prediction to the dense model over
11-chunk self-rollouts, `self_forcing_loss`) on `--heldout` other noise keys after a step of
each size (equal L2 norms) along -gradient (gradient descent), +gradient, -sign(gradient) (what
Adam's first steps do: every element moved alike) and a random direction. A faithful surrogate
lowers the loss along -gradient and -sign for small steps.

    python benchmarks/sparse_selection_direction.py --grad-keys 4 --heldout 6 --scales 0.001,0.003
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_training_gate import _prompts
from vidax.forcing import load
from vidax.forcing.train import self_forcing_loss
from vidax.models.registry import get_causal
from vidax.text import embed_prompts


def _is_compress_k(path) -> bool:
    return any(getattr(p, "key", getattr(p, "name", None)) == "compress_k" for p in path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-causal")
    p.add_argument("--prompts", type=int, default=4, help="batch of every rollout")
    p.add_argument("--chunks", type=int, default=11, help="chunks per rollout (the stage's)")
    p.add_argument("--grad-keys", type=int, default=4)
    p.add_argument("--heldout", type=int, default=6)
    p.add_argument("--scales", default="0.001,0.003,0.01", help="rms element of each step")
    p.add_argument("--directions", default="-gradient,+gradient,-sign,random")
    args = p.parse_args()

    preset = get_causal(args.model)
    spec = preset.spec
    d = spec.defaults
    _, h, w, c = spec.geometry().latent_shape(1, d.height, d.width)
    dense = load(preset.weights_path("dense"), spec.config)
    text = embed_prompts(spec, [q.caption for q in _prompts(args.prompts)])
    context = jnp.asarray(text.embeds * text.mask[..., None].astype(text.embeds.dtype))
    # The stage's student: the gather path carries the surrogate.
    sparse = dataclasses.replace(preset.forcing("sparse"), pbsa_backend="gather")
    layout = dense.layout(sparse, (h, w))
    teacher_layout = dense.layout(preset.forcing("dense"), (h, w))
    graphdef, params = nnx.split(dense)
    (ck0,) = [x for path, x in jax.tree_util.tree_leaves_with_path(params) if _is_compress_k(path)]

    def loss(ck, key):
        state = jax.tree_util.tree_map_with_path(
            lambda path, x: ck if _is_compress_k(path) else x, params
        )
        return self_forcing_loss(
            graphdef, state, params, context, key, layout, teacher_layout,
            num_chunks=args.chunks, teacher_steps=1, latent_hw=(h, w), channels=c,
        )[0]  # fmt: skip

    grad, value = jax.jit(jax.grad(loss)), jax.jit(loss)
    start = time.time()
    grads = [np.asarray(grad(ck0, jax.random.key(500 + i))) for i in range(args.grad_keys)]
    g = np.mean(grads, axis=0)
    cos = [
        float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))
        for i, a in enumerate(grads)
        for b in grads[i + 1 :]
    ]
    print(f"# {preset.name}, compress_k {tuple(ck0.shape)}, {args.prompts} prompts, "
          f"{args.chunks}-chunk rollouts; gradients in {time.time() - start:.0f} s")  # fmt: skip
    if cos:
        print(f"per-key gradient cosine: mean {np.mean(cos):.3f} (min {min(cos):.3f}, max "
              f"{max(cos):.3f})")  # fmt: skip
    layer_share = np.sqrt((g**2).reshape(g.shape[0], -1).sum(1)) / np.linalg.norm(g)
    print(
        f"mean gradient: max |element| / rms {np.abs(g).max() / np.sqrt(np.mean(g**2)):.1f}; "
        "share of its squared norm per layer " + " ".join(f"{x**2:.2f}" for x in layer_share)
    )
    keys = [jax.random.key(1002 + i) for i in range(args.heldout)]

    def heldout(ck) -> float:
        return float(np.mean([float(value(jnp.asarray(ck), k)) for k in keys]))

    base = heldout(ck0)
    print(f"held-out loss at the zero init ({args.heldout} keys): {base:.5f}")
    directions = {
        "-gradient": -g,
        "+gradient": g,
        "-sign": -np.sign(g),  # Adam's first steps move every element alike
        "random": np.random.default_rng(0).standard_normal(g.shape).astype(np.float32),
    }
    if unknown := set(args.directions.split(",")) - set(directions):
        raise SystemExit(f"unknown direction(s) {sorted(unknown)}; known: {list(directions)}")
    print("step (rms element)     direction  change of the held-out loss")
    for scale in (float(s) for s in args.scales.split(",")):
        for name in args.directions.split(","):
            direction = directions[name]
            step = direction / np.sqrt(np.mean(direction**2)) * scale  # equal L2 norms
            print(f"{scale:<22g} {name:10s} {heldout(ck0 + step) - base:+.5f}", flush=True)


if __name__ == "__main__":
    main()
