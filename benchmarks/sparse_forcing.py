"""Sparse Forcing vs the dense-window causal model (Self-Forcing), side by side in one run.

For a short rollout and rollouts 4x and 12x as long (the paper's 5 s / 20 s / 1 min ratio;
short = 7 chunks of 3 latent frames = 81 frames), both models of a causal preset generate the
same prompts from the same noise, and the script prints:

- decode speed-up: wall time of the whole chunked rollout (DiT only, compiled once, measured
  interleaved after a warm-up, median of `--repeats`), dense / sparse, batch 1. At the trained
  size, and at a larger latent size (`--speed-latent`, blocks scaled to keep 4 per frame) where
  attention is a larger share of the step, as at real video sizes (timing only, same weights;
  the tiny model at 64 tokens per frame is dominated by per-op overhead on a CPU);
- peak KV-cache bytes ratio (the cache buffers plus the current chunk's keys/values);
- the metric suite on the VAE-decoded videos (subject consistency, temporal flicker, motion
  fidelity; `vidax.metrics`), over the whole rollout and over its last quarter, mean over
  prompts;
- per-chunk latency of chunks 1, 10 and 50 of a streamed rollout (cost stays flat).

The sparse model's selected branch is timed through `vidax.kernels.pbsa` (`pbsa_backend="auto"`:
the XLA reference path on a CPU, the Triton/Mosaic kernel on a GPU/TPU, where the reference is
timed beside it) and through the XLA gather path (`"gather"`), which is what runs fast on a CPU.

    JAX_PLATFORMS=cpu python benchmarks/sparse_forcing.py [--prompts 6 --repeats 3 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

import jax
import numpy as np

from vidax.data import EVAL_PROMPTS
from vidax.forcing import ChunkStepper, generate_latents, load_causal
from vidax.metrics import motion_fidelity, subject_consistency, temporal_flicker
from vidax.models.registry import get_causal as get
from vidax.models.registry import get_vae
from vidax.models.weights import load_vae
from vidax.text import embed_prompts

LENGTHS = (("short", 1), ("4x", 4), ("12x", 12))
METRICS = ("subject_consistency", "temporal_flicker", "motion_fidelity")
HIGHER_IS_BETTER = {"subject_consistency": True, "temporal_flicker": False, "motion_fidelity": True}


def _context(spec, prompts):
    text = embed_prompts(spec, list(prompts))
    return text.embeds * text.mask[..., None].astype(text.embeds.dtype)


def _timed(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time of each zero-argument function, runs interleaved (after a warm-up)."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(s)) for name, s in samples.items()}


def peak_kv_bytes(model, layout, batch: int = 1) -> int:
    """Bytes of the cache buffers of every layer plus the current chunk's keys and values."""
    cache = jax.eval_shape(lambda: model.init_cache(layout, batch))
    buffers = sum(
        int(np.prod(x.shape)) * x.dtype.itemsize for x in (cache.k, cache.v, cache.ck, cache.cv)
    )
    c = model.config
    chunk = 2 * c.num_layers * batch * layout.chunk_tokens * c.num_heads * c.head_dim
    return buffers + chunk * c.compute_dtype.itemsize


def _metrics(video: np.ndarray, caption: str) -> dict[str, float]:
    return {
        "subject_consistency": subject_consistency(video),
        "temporal_flicker": temporal_flicker(video),
        "motion_fidelity": motion_fidelity(video, caption),
    }


def _prompts(n: int):
    """`n` evaluation prompts spread over the categories."""
    by_category: dict[str, list] = {}
    for p in EVAL_PROMPTS:
        by_category.setdefault(p.category, []).append(p)
    out, i = [], 0
    while len(out) < n:
        for items in by_category.values():
            if i < len(items) and len(out) < n:
                out.append(items[i])
        i += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-causal")
    p.add_argument("--short-chunks", type=int, default=7, help="chunks of the short rollout")
    p.add_argument("--prompts", type=int, default=6, help="evaluation prompts per length")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per model and length")
    p.add_argument(
        "--speed-latent", type=int, default=24, help="extra timing at this latent size (0: off)"
    )
    p.add_argument(
        "--speed-repeats", type=int, default=1, help="timed runs per model at --speed-latent"
    )
    p.add_argument("--latency-chunks", type=int, default=50)
    p.add_argument("--skip-metrics", action="store_true")
    p.add_argument(
        "--skip-timing", action="store_true", help="metrics only (no decode / latency timing)"
    )
    p.add_argument("--vae", default=None, help="VAE weights file (default: the shipped ones)")
    p.add_argument("--lengths", default="short,4x,12x", help="rollout lengths to run")
    p.add_argument("--sizes", default="trained,large", help="timing sizes (large: --speed-latent)")
    args = p.parse_args()
    lengths = [(name, mult) for name, mult in LENGTHS if name in args.lengths.split(",")]

    preset = get(args.model)
    spec = preset.spec
    d = spec.defaults
    geo = spec.geometry()
    _, h, w, c = geo.latent_shape(1, d.height, d.width)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models = {a: load_causal(preset, a) for a in ("dense", "sparse")}
        if args.vae is not None:
            vae_spec = get_vae(spec.vae)
            vae = vae_spec.loader(args.vae, vae_spec.config)
        else:
            vae = load_vae(spec, None)
    for warning in caught:
        print(f"warning: {warning.message}")
    layouts = {a: models[a].layout(preset.forcing(a), (h, w)) for a in models}
    device = jax.devices()[0]
    print(f"# Sparse Forcing benchmark: {preset.name} on {device.platform} ({device.device_kind})")
    for a, lay in layouts.items():
        cfg = lay.config
        print(
            f"  {a:6s}: sink {cfg.sink_frames} + window {cfg.window_frames} frames, "
            f"memory {cfg.memory_blocks} blocks, top-k local {cfg.local_topk} / memory "
            f"{cfg.memory_topk}, compressed {cfg.compressed_tokens}; {lay.tokens_per_frame} "
            f"tokens/frame, block {lay.block_size}"
        )

    # -- peak KV cache ---------------------------------------------------------------------------
    peak = {a: peak_kv_bytes(models[a], layouts[a]) for a in models}
    kv_ratio = peak["sparse"] / peak["dense"]
    print(
        f"\npeak KV cache: dense {peak['dense'] / 2**10:.1f} KiB, sparse "
        f"{peak['sparse'] / 2**10:.1f} KiB -> ratio {kv_ratio:.3f} (target <= 0.58)"
    )

    # -- decode speed ----------------------------------------------------------------------------
    one = _context(spec, [_prompts(1)[0].caption])
    speed_rows = []
    sizes = [("trained", (h, w))] if "trained" in args.sizes.split(",") else []
    if args.skip_timing:
        sizes = []
    if args.speed_latent and "large" in args.sizes.split(",") and not args.skip_timing:
        sizes.append((f"latent {args.speed_latent}", (args.speed_latent, args.speed_latent)))
    # "auto" is the PBSA reference path on a CPU and the kernel on an accelerator; "gather" is
    # the XLA gather + batched-matmul path (vidax.forcing.attention.gather_attention).
    backends = [("auto", None), ("gather", "gather")]
    if device.platform != "cpu":
        backends.append(("reference", "reference"))
    for size_name, hw in sizes:
        # Same block structure at a larger size: blocks grow with the tokens of a frame.
        _, ph, pw = spec.config.patch_size
        frame_tokens = (hw[0] // ph) * (hw[1] // pw)
        repeats = args.repeats if hw == (h, w) else args.speed_repeats
        for name, mult in lengths:
            n = args.short_chunks * mult
            fns = {}
            for a, model in models.items():
                for backend, override in backends:
                    if a == "dense" and override is not None:
                        continue
                    cfg = preset.forcing(a)
                    per_frame = layouts[a].blocks_per_frame
                    cfg = dataclasses.replace(cfg, block_size=frame_tokens // per_frame)
                    if cfg.query_tile is not None:  # the largest tile <= the preset's that fits
                        chunk_tokens = frame_tokens * cfg.chunk_frames
                        tile = max(t for t in range(1, cfg.query_tile + 1) if chunk_tokens % t == 0)
                        cfg = dataclasses.replace(cfg, query_tile=tile)
                    if override is not None:
                        cfg = dataclasses.replace(cfg, pbsa_backend=override)
                    lay = model.layout(cfg, hw)
                    key = f"{a}" if override is None else f"{a}:{backend}"
                    fns[key] = lambda m=model, lay=lay, hw=hw, n=n: generate_latents(
                        m, jax.random.key(0), one, lay, n, latent_hw=hw, channels=c
                    )
            times = _timed(fns, repeats)
            row = (size_name, name, n, times)
            speed_rows.append(row)
            extra = "".join(
                f", sparse[{k.split(':')[1]}] {times[k]:.2f} s ({times['dense'] / times[k]:.2f}x)"
                for k in times
                if ":" in k
            )
            print(
                f"decode {size_name:10s} {name:5s} ({n:3d} chunks): dense {times['dense']:.2f} s, "
                f"sparse {times['sparse']:.2f} s -> speed-up {times['dense'] / times['sparse']:.2f}x"
                + extra,
                flush=True,
            )

    # -- per-chunk latency -----------------------------------------------------------------------
    print("\nper-chunk latency (streamed, compiled once; ms):")
    for a, model in models.items() if args.latency_chunks and not args.skip_timing else ():
        stepper = ChunkStepper(model, layouts[a], latent_hw=(h, w), channels=c)
        key = jax.random.key(1)
        cache = stepper.init(1)
        x, cache = stepper(cache, 0, key, one)  # compile
        jax.block_until_ready(x)
        cache = stepper.init(1)
        lat = []
        for i in range(args.latency_chunks):
            start = time.perf_counter()
            x, cache = stepper(cache, i, key, one)
            jax.block_until_ready(x)
            lat.append(time.perf_counter() - start)
        picks = [i for i in (1, 10, 50) if i <= len(lat)]
        shown = ", ".join(f"chunk {i}: {1e3 * lat[i - 1]:.1f}" for i in picks)
        tail = np.median(lat[len(lat) // 2 :]) / np.median(lat[1 : max(2, len(lat) // 5)])
        print(f"  {a:6s}: {shown} (late/early median ratio {tail:.2f})")

    if args.skip_metrics:
        return

    # -- metrics ---------------------------------------------------------------------------------
    prompts = _prompts(args.prompts)
    context = _context(spec, [q.caption for q in prompts])
    print(f"\nmetrics over {len(prompts)} prompts (mean; whole rollout | last quarter):")
    header = "".join(f"{m:>28s}" for m in METRICS)
    print(f"{'length':6s} {'model':6s}{header}")
    results = {}
    for name, mult in lengths:
        n = args.short_chunks * mult
        for a, model in models.items():
            lat = generate_latents(
                model, jax.random.key(2), context, layouts[a], n, latent_hw=(h, w), channels=c
            )
            frames = np.asarray(vae.decode(lat)) if vae is not None else None
            whole, last = [], []
            for i, q in enumerate(prompts):
                video = frames[i]
                whole.append(_metrics(video, q.caption))
                last.append(_metrics(video[-(video.shape[0] // 4) :], q.caption))
            mean = lambda rows: {m: float(np.mean([r[m] for r in rows])) for m in METRICS}
            results[(name, a)] = (mean(whole), mean(last))
            cells = "".join(
                f"{results[(name, a)][0][m]:>13.4f} | {results[(name, a)][1][m]:<12.4f}"
                for m in METRICS
            )
            print(f"{name:6s} {a:6s}{cells}", flush=True)

    print("\nsummary (sparse vs dense):")
    print(f"  peak KV-cache ratio: {kv_ratio:.3f} (target <= 0.58)")
    for size_name, name, _, times in speed_rows:
        target = 1.1 if name == "short" else 1.25
        others = "".join(
            f", [{k.split(':')[1]}] {times['dense'] / times[k]:.2f}x" for k in times if ":" in k
        )
        print(
            f"  decode speed-up {size_name:10s} {name:5s}: {times['dense'] / times['sparse']:.2f}x "
            f"[pbsa {'reference' if device.platform == 'cpu' else 'kernel'}]{others} "
            f"(target >= {target})"
        )
    for name, _ in lengths:
        for part, label in ((0, "whole"), (1, "last quarter")):
            cmp = []
            for m in METRICS:
                s, dn = results[(name, "sparse")][part][m], results[(name, "dense")][part][m]
                better = s > dn if HIGHER_IS_BETTER[m] else s < dn
                cmp.append(f"{m} {s:.4f} vs {dn:.4f} ({'better' if better else 'not better'})")
            print(f"  {name:5s} {label:12s}: " + "; ".join(cmp))


if __name__ == "__main__":
    main()
