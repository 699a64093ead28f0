"""Peak memory of chunked Wan VAE decoding at 17, 33 and 65 frames.

Decoding scans over latent frames with a fixed-shape causal cache, so everything but the output
should stay flat as videos grow. Two measures, side by side, per frame count:

- XLA: the compiled executable's `memory_analysis()` (temp + output bytes; the parameters and
  the latent input are arguments, the same for every length up to the tiny input);
- RSS: `ru_maxrss` of a fresh subprocess that builds the model, compiles and decodes once.

    JAX_PLATFORMS=cpu python benchmarks/vae_memory.py [--size 128] [--base-dim 32]

Target: the 65-frame peak is at most 1.5x the 17-frame peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

FRAMES = (17, 33, 65)


def _build(base_dim: int):
    import dataclasses

    from flax import nnx

    from vidax.models.wan_vae import PRESETS, WanVAE

    config = dataclasses.replace(PRESETS["wan2.1"], base_dim=base_dim)
    return WanVAE(config, rngs=nnx.Rngs(0))


def measure(frames: int, size: int, base_dim: int, run: bool) -> dict:
    """Compiles (and optionally runs) decode of one `frames`-frame video of size x size pixels."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    vae = _build(base_dim)
    cfg = vae.config
    s = cfg.spatial_factor
    z = jnp.zeros((1, cfg.latent_frames(frames), size // s, size // s, cfg.z_dim), jnp.float32)
    graphdef, state = nnx.split(vae)

    def decode(state, z, latents_per_step=1):
        return nnx.merge(graphdef, state).decode_raw(z, latents_per_step=latents_per_step)

    t0 = time.perf_counter()
    compiled = jax.jit(decode).lower(state, z).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    out = {
        "frames": frames,
        "temp": mem.temp_size_in_bytes,
        "output": mem.output_size_in_bytes,
        "args": mem.argument_size_in_bytes,
        "compile_s": compile_s,
    }
    if run:
        t0 = time.perf_counter()
        compiled(state, z).block_until_ready()
        out["run_s"] = time.perf_counter() - t0
        # ru_maxrss is in KiB on Linux; read before the contrast compile below.
        out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # For contrast: all latent frames after the first in one step (no chunking over time).
    whole = jax.jit(decode, static_argnums=2).lower(state, z, z.shape[1] - 1).compile()
    whole_mem = whole.memory_analysis()
    out["unchunked"] = whole_mem.temp_size_in_bytes + whole_mem.output_size_in_bytes
    return out


def _fresh(frames: int, size: int, base_dim: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(frames),
        "--size",
        str(size),
        "--base-dim",
        str(base_dim),
    ]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _baseline_rss(size: int, base_dim: int) -> int:
    """RSS of a subprocess that imports jax and builds the model but decodes nothing."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "0",
        "--size",
        str(size),
        "--base-dim",
        str(base_dim),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["rss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128, help="frame height = width (pixels)")
    parser.add_argument("--base-dim", type=int, default=32, help="VAE base width (Wan 2.1: 96)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        if args.child == 0:
            _build(args.base_dim)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            print(json.dumps({"rss": rss}))
        else:
            print(json.dumps(measure(args.child, args.size, args.base_dim, run=True)))
        return

    mib = 2.0**20
    print(f"Wan 2.1 VAE decode, base_dim={args.base_dim}, {args.size}x{args.size} px, batch 1")
    base = _baseline_rss(args.size, args.base_dim)
    rows = [_fresh(f, args.size, args.base_dim) for f in FRAMES]
    header = (
        f"{'frames':>6} {'XLA temp':>10} {'output':>9} {'temp+out':>9} "
        f"{'peak RSS':>9} {'RSS-base':>9} {'unchunked':>10} {'compile':>8} {'run':>7}"
    )
    print(header)
    for r in rows:
        r["peak"] = r["temp"] + r["output"]
        print(
            f"{r['frames']:>6} {r['temp'] / mib:>8.1f}Mi {r['output'] / mib:>7.1f}Mi "
            f"{r['peak'] / mib:>7.1f}Mi {r['rss'] / mib:>7.1f}Mi {(r['rss'] - base) / mib:>7.1f}Mi "
            f"{r['unchunked'] / mib:>8.1f}Mi {r['compile_s']:>7.1f}s {r['run_s']:>6.1f}s"
        )
    print(
        f"(RSS of a process that only builds the model: {base / mib:.1f} MiB; 'unchunked' is "
        "XLA temp+out with all latent frames after the first in one step)"
    )
    first = rows[0]
    for r in rows[1:]:
        print(
            f"ratio {r['frames']}/{first['frames']}: XLA temp+out {r['peak'] / first['peak']:.2f}x, "
            f"peak RSS {r['rss'] / first['rss']:.2f}x, "
            f"RSS above baseline {(r['rss'] - base) / (first['rss'] - base):.2f}x, "
            f"unchunked {r['unchunked'] / first['unchunked']:.2f}x"
        )
    ok = rows[-1]["peak"] <= 1.5 * first["peak"] and rows[-1]["rss"] <= 1.5 * first["rss"]
    print(f"target 65-frame peak <= 1.5x 17-frame peak: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
