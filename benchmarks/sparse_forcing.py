"""Sparse Forcing vs the dense Self-Forcing baseline, at equal context span and at equal KV memory.

Four configurations of a causal preset, each run with its trained weights (dense or sparse):

- `dense`: the preset's Self-Forcing baseline (sink + window, the cache growing to it);
- `sparse@span`: the sparse preset with its memory's reach bounded (`memory_frames`) so that
  window + memory cover exactly the frames dense's window covers: equal context span;
- `dense@kv`: dense with the window whose peak KV cache is nearest the sparse one's: equal
  memory;
- `sparse`: the sparse preset as trained (memory of any age).

Comparison (a) is `dense` vs `sparse@span`, (b) `dense@kv` vs `sparse`. For each the script
prints:

- the peak KV-cache bytes ratio (cache buffers plus the current chunk's keys and values);
- per-chunk decode time of a streamed rollout (`ChunkStepper`, compiled once, the configurations
  interleaved chunk by chunk, batch 1): the mean over the short rollout (where dense's cache is
  still growing) and the median at steady state (every cache full, memory and rings cycling),
  at the trained size and at a larger latent (`--speed-latent`, blocks scaled to keep their
  number per frame), where attention is a larger share of a step as at real video sizes. The
  sparse selected branch runs through `pbsa_backend="auto"` (the Triton/Mosaic kernel on a
  GPU/TPU, the XLA gather path on a CPU), through PBSA's reference (`"reference"`) and on an
  accelerator also through the gather path;
- the metric suite on VAE-decoded videos of a short rollout and rollouts 4x and 12x as long
  (subject consistency, temporal flicker, motion fidelity; `vidax.metrics`), over the whole
  rollout and its last quarter, mean over prompts.

    JAX_PLATFORMS=cpu python benchmarks/sparse_forcing.py [--skip-metrics | --skip-timing] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

import jax
import numpy as np

from vidax.data import EVAL_PROMPTS
from vidax.forcing import ChunkStepper, ForcingConfig, generate_latents, load_causal
from vidax.metrics import motion_fidelity, subject_consistency, temporal_flicker
from vidax.models.registry import get_causal as get
from vidax.models.registry import get_vae
from vidax.models.weights import load_vae
from vidax.text import embed_prompts

LENGTHS = (("short", 1), ("4x", 4), ("12x", 12))
METRICS = ("subject_consistency", "temporal_flicker", "motion_fidelity")
HIGHER_IS_BETTER = {"subject_consistency": True, "temporal_flicker": False, "motion_fidelity": True}
# (label, dense configuration, sparse configuration)
COMPARISONS = (
    ("(a) equal context span", "dense", "sparse@span"),
    ("(b) equal KV memory", "dense@kv", "sparse"),
)


def _context(spec, prompts):
    text = embed_prompts(spec, list(prompts))
    return text.embeds * text.mask[..., None].astype(text.embeds.dtype)


def comparison_configs(
    dense: ForcingConfig, sparse: ForcingConfig, kv_bytes
) -> dict[str, ForcingConfig]:
    """The four configurations (module docstring) from a preset's dense and sparse ones.

    Args:
      dense, sparse: the preset's configurations.
      kv_bytes: ForcingConfig -> peak KV bytes at the benchmark's size.
    """
    reach = dense.context_frames - sparse.sink_frames - sparse.window_frames
    if reach < sparse.chunk_frames or not sparse.memory_blocks:
        raise ValueError(
            f"the sparse window ({sparse.sink_frames} + {sparse.window_frames} frames) leaves no "
            f"memory reach inside dense's span of {dense.context_frames} frames"
        )
    c = dense.chunk_frames
    windows = range(c, dense.window_frames + 1, c)
    target = kv_bytes(sparse)
    window = min(
        windows, key=lambda w: abs(kv_bytes(dataclasses.replace(dense, window_frames=w)) - target)
    )
    return {
        "dense": dense,
        "sparse@span": dataclasses.replace(sparse, memory_frames=reach),
        "dense@kv": dataclasses.replace(dense, window_frames=window),
        "sparse": sparse,
    }


def at_size(cfg: ForcingConfig, blocks_per_frame: int, frame_tokens: int) -> ForcingConfig:
    """`cfg` for frames of `frame_tokens` tokens: the same blocks per frame (larger blocks) and
    the largest query tile up to the configured one that divides a chunk."""
    cfg = dataclasses.replace(cfg, block_size=frame_tokens // blocks_per_frame)
    if cfg.query_tile is not None:
        chunk_tokens = frame_tokens * cfg.chunk_frames
        tile = max(t for t in range(1, cfg.query_tile + 1) if chunk_tokens % t == 0)
        cfg = dataclasses.replace(cfg, query_tile=tile)
    return cfg


def per_chunk_times(steppers: dict, chunks: int, context) -> dict[str, np.ndarray]:
    """Seconds per chunk of a streamed rollout of `chunks` chunks for each stepper, the steppers
    interleaved chunk by chunk (so load from other jobs hits them alike), after compiling."""
    key = jax.random.key(1)
    caches = {}
    for name, stepper in steppers.items():
        x, _ = stepper(stepper.init(1), 0, key, context)  # compile
        jax.block_until_ready(x)
        caches[name] = stepper.init(1)
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for i in range(chunks):
        for name, stepper in steppers.items():
            start = time.perf_counter()
            x, caches[name] = stepper(caches[name], i, key, context)
            jax.block_until_ready(x)
            times[name].append(time.perf_counter() - start)
    return {name: np.asarray(t) for name, t in times.items()}


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


def _describe(cfg: ForcingConfig) -> str:
    if cfg.sparse:
        reach = f"{cfg.memory_frames} frames" if cfg.memory_frames else "any age"
        memory = f"{cfg.memory_blocks} blocks ({reach}), compressed {cfg.compressed_tokens}"
    else:
        memory = "-"
    span = cfg.context_frames if cfg.context_frames is not None else "unbounded"
    return (
        f"sink {cfg.sink_frames} + window {cfg.window_frames} frames, memory {memory}; "
        f"context span {span} frames"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-causal")
    p.add_argument("--short-chunks", type=int, default=7, help="chunks of the short rollout")
    p.add_argument("--prompts", type=int, default=6, help="evaluation prompts per length")
    p.add_argument("--chunks", type=int, default=30, help="chunks of each timed stream")
    p.add_argument(
        "--steady-from", type=int, default=10, help="first chunk counted as steady state"
    )
    p.add_argument(
        "--speed-latent", type=int, default=24, help="extra timing at this latent size (0: off)"
    )
    p.add_argument("--skip-metrics", action="store_true")
    p.add_argument("--skip-timing", action="store_true", help="metrics only (no per-chunk timing)")
    p.add_argument("--vae", default=None, help="VAE weights file (default: the shipped ones)")
    p.add_argument("--lengths", default="short,4x,12x", help="rollout lengths of the metrics")
    p.add_argument("--sizes", default="trained,large", help="timing sizes (large: --speed-latent)")
    args = p.parse_args()
    if args.steady_from >= args.chunks:
        p.error("--steady-from must be below --chunks")
    lengths = [(name, mult) for name, mult in LENGTHS if name in args.lengths.split(",")]

    preset = get(args.model)
    spec = preset.spec
    d = spec.defaults
    geo = spec.geometry()
    _, h, w, c = geo.latent_shape(1, d.height, d.width)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights = {a: load_causal(preset, a) for a in ("dense", "sparse")}
        if args.vae is not None:
            vae_spec = get_vae(spec.vae)
            vae = vae_spec.loader(args.vae, vae_spec.config)
        else:
            vae = load_vae(spec, None)
    for warning in caught:
        print(f"warning: {warning.message}")
    model_of = lambda cfg: weights[cfg.attention]
    kv_bytes = lambda cfg: peak_kv_bytes(model_of(cfg), model_of(cfg).layout(cfg, (h, w)))
    configs = comparison_configs(preset.forcing("dense"), preset.forcing("sparse"), kv_bytes)
    layouts = {name: model_of(cfg).layout(cfg, (h, w)) for name, cfg in configs.items()}
    peak = {name: kv_bytes(cfg) for name, cfg in configs.items()}
    device = jax.devices()[0]
    lay = layouts["dense"]
    print(f"# Sparse Forcing benchmark: {preset.name} on {device.platform} ({device.device_kind})")
    print(f"configurations ({lay.tokens_per_frame} tokens/frame, block {lay.block_size}):")
    for name, cfg in configs.items():
        print(f"  {name:12s}: {_describe(cfg)}; peak KV {peak[name] / 2**10:.1f} KiB")
    print("\npeak KV cache (sparse / dense):")
    for label, dn, sp in COMPARISONS:
        print(f"  {label:24s}: {dn} vs {sp}: {peak[sp] / peak[dn]:.3f}")

    # -- per-chunk decode time -------------------------------------------------------------------
    one = _context(spec, [_prompts(1)[0].caption])
    sizes = []
    if not args.skip_timing:
        if "trained" in args.sizes.split(","):
            sizes.append(("trained", (h, w)))
        if args.speed_latent and "large" in args.sizes.split(","):
            sizes.append((f"latent {args.speed_latent}", (args.speed_latent, args.speed_latent)))
    # "auto" is the PBSA kernel on an accelerator and the XLA gather + batched-matmul path
    # (vidax.forcing.attention.gather_attention) on a CPU; "reference" is PBSA's reference.
    backends = ["auto", "reference"] + (["gather"] if device.platform != "cpu" else [])
    timing_rows = []
    for size_name, hw in sizes:
        _, ph, pw = spec.config.patch_size
        frame_tokens = (hw[0] // ph) * (hw[1] // pw)
        steppers = {}
        for name, cfg in configs.items():
            cfg = at_size(cfg, layouts[name].blocks_per_frame, frame_tokens)
            for backend in backends if cfg.sparse else ["-"]:
                run = cfg if backend == "-" else dataclasses.replace(cfg, pbsa_backend=backend)
                key = name if backend == "-" else f"{name}[{backend}]"
                model = model_of(cfg)
                steppers[key] = ChunkStepper(model, model.layout(run, hw), latent_hw=hw, channels=c)
        times = per_chunk_times(steppers, args.chunks, one)
        steady = {k: float(np.median(t[args.steady_from :])) for k, t in times.items()}
        short = {k: float(np.mean(t[: args.short_chunks])) for k, t in times.items()}
        print(
            f"\nper-chunk decode at {size_name} ({frame_tokens} tokens/frame; ms; short = mean of "
            f"chunks 1-{args.short_chunks}, steady = median of chunks "
            f"{args.steady_from + 1}-{args.chunks}):"
        )
        print(f"  {'configuration':22s} {'short':>8s} {'steady':>8s}  chunk 1 / 10 / {args.chunks}")
        for k, t in times.items():
            picks = " / ".join(f"{1e3 * t[i - 1]:.1f}" for i in (1, 10, args.chunks))
            print(f"  {k:22s} {1e3 * short[k]:8.1f} {1e3 * steady[k]:8.1f}  {picks}")
        for label, dn, sp in COMPARISONS:
            for backend in backends:
                sk = f"{sp}[{backend}]"
                timing_rows.append(
                    (size_name, label, backend, steady[dn] / steady[sk], short[dn] / short[sk])
                )

    if timing_rows:
        print("\nsparse speed-up over dense (dense time / sparse time, per chunk):")
        print(f"  {'size':10s} {'comparison':24s} {'backend':10s} {'steady':>7s} {'short':>7s}")
        for size_name, label, backend, steady_x, short_x in timing_rows:
            print(
                f"  {size_name:10s} {label:24s} {backend:10s} {steady_x:6.2f}x {short_x:6.2f}x",
                flush=True,
            )

    if args.skip_metrics:
        return

    # -- metrics ---------------------------------------------------------------------------------
    prompts = _prompts(args.prompts)
    context = _context(spec, [q.caption for q in prompts])
    print(f"\nmetrics over {len(prompts)} prompts (mean; whole rollout | last quarter):")
    header = "".join(f"{m:>28s}" for m in METRICS)
    print(f"{'length':6s} {'configuration':12s}{header}")
    results = {}
    for name, mult in lengths:
        n = args.short_chunks * mult
        for cname, cfg in configs.items():
            lat = generate_latents(
                model_of(cfg),
                jax.random.key(2),
                context,
                layouts[cname],
                n,
                latent_hw=(h, w),
                channels=c,
            )
            frames = np.asarray(vae.decode(lat))
            whole, last = [], []
            for i, q in enumerate(prompts):
                video = frames[i]
                whole.append(_metrics(video, q.caption))
                last.append(_metrics(video[-(video.shape[0] // 4) :], q.caption))
            mean = lambda rows: {m: float(np.mean([r[m] for r in rows])) for m in METRICS}
            results[(name, cname)] = (mean(whole), mean(last))
            cells = "".join(
                f"{results[(name, cname)][0][m]:>13.4f} | {results[(name, cname)][1][m]:<12.4f}"
                for m in METRICS
            )
            print(f"{name:6s} {cname:12s}{cells}", flush=True)

    print("\nsummary (sparse vs dense):")
    for label, dn, sp in COMPARISONS:
        print(f"  {label}: {sp} vs {dn}, peak KV ratio {peak[sp] / peak[dn]:.3f}")
        for name, _ in lengths:
            for part, where in ((0, "whole"), (1, "last quarter")):
                cmp = []
                for m in METRICS:
                    s_, d_ = results[(name, sp)][part][m], results[(name, dn)][part][m]
                    better = s_ > d_ if HIGHER_IS_BETTER[m] else s_ < d_
                    cmp.append(f"{m} {s_:.4f} vs {d_:.4f} ({'better' if better else 'not better'})")
                print(f"    {name:5s} {where:12s}: " + "; ".join(cmp))


if __name__ == "__main__":
    main()
