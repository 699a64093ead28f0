"""Micro-benchmark: sparse block selection vs dense attention over the whole KV pool.

On CPU, interpreted Pallas kernels say nothing about speed, so this measures the XLA reference
path (`pbsa_reference`: gather the selected blocks, attend) against dense attention over the whole
pool (`vidax.nn.attention`, once unmasked and once with the selection as a dense mask), at
25/50/100% of the blocks selected. Runs are interleaved and the median of each is reported, so
the ratios are measured side by side under the same machine load. On a TPU or GPU, the Pallas
kernel is timed too.

    JAX_PLATFORMS=cpu python benchmarks/pbsa_kernel.py [--lq 1024 --slots 64 ...]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from vidax.kernels.pbsa import pbsa, pbsa_reference, selection_mask
from vidax.nn import attention


def _median_times(fns: dict, args: dict, repeats: int) -> dict[str, float]:
    for name, fn in fns.items():  # compile and warm up
        jax.block_until_ready(fn(*args[name]))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args[name]))
            samples[name].append(time.perf_counter() - t0)
    return {name: float(np.median(s)) for name, s in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--lq", type=int, default=1024, help="query tokens (the current chunk)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--slots", type=int, default=64, help="pool blocks per KV head")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--block-q", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fractions", default="0.25,0.5,1.0")
    a = p.parse_args()

    dtype = jnp.dtype(a.dtype)
    rng = np.random.default_rng(0)
    b, n, n_kv, lq, k = a.batch, a.heads, a.kv_heads, a.lq, a.head_dim
    nq = -(-lq // a.block_q)
    q = jnp.asarray(rng.normal(size=(b, n, lq, k)), dtype)
    pool_shape = (b, n_kv, a.slots, a.block_size, k)
    pool_k = jnp.asarray(rng.normal(size=pool_shape), dtype)
    pool_v = jnp.asarray(rng.normal(size=pool_shape), dtype)
    g = n // n_kv

    def tokens(pool):
        return jnp.repeat(pool.reshape(b, n_kv, -1, k), g, axis=1).transpose(0, 2, 1, 3)

    @jax.jit
    def dense(q, pool_k, pool_v):
        out = attention(q.transpose(0, 2, 1, 3), tokens(pool_k), tokens(pool_v), impl="xla")
        return out.transpose(0, 2, 1, 3)

    @jax.jit
    def dense_masked(q, pool_k, pool_v, mask):
        mask = jnp.repeat(mask, g, axis=1)
        out = attention(
            q.transpose(0, 2, 1, 3), tokens(pool_k), tokens(pool_v), mask=mask, impl="xla"
        )
        return out.transpose(0, 2, 1, 3)

    platform = jax.default_backend()
    print(
        f"platform={platform} dtype={dtype.name} b={b} n={n} n_kv={n_kv} lq={lq} k={k} "
        f"pool={a.slots}x{a.block_size} tokens block_q={a.block_q}"
    )
    header = f"{'selected':>9} {'dense ms':>9} {'masked ms':>10} {'sparse ms':>10} {'speed-up':>9}"
    header += f" {'vs masked':>10}" + (f" {'kernel ms':>10}" if platform != "cpu" else "")
    print(header)
    for frac in (float(f) for f in a.fractions.split(",")):
        max_sel = max(1, round(frac * a.slots))
        # Distinct random slots per query tile and KV head (what a top-k selection produces).
        idx = np.argsort(rng.random((b, n_kv, nq, a.slots)), axis=-1)[..., :max_sel]
        idx = jnp.asarray(idx, jnp.int32)
        cnt = jnp.full((b, n_kv, nq), max_sel, jnp.int32)
        mask = selection_mask(
            idx, cnt, num_slots=a.slots, block_size=a.block_size, lq=lq, block_q=a.block_q
        )
        sparse = jax.jit(functools.partial(pbsa_reference, block_q=a.block_q))
        fns = {"dense": dense, "masked": dense_masked, "sparse": sparse}
        args = {
            "dense": (q, pool_k, pool_v),
            "masked": (q, pool_k, pool_v, mask),
            "sparse": (q, pool_k, pool_v, idx, cnt),
        }
        if platform != "cpu":
            fns["kernel"] = jax.jit(functools.partial(pbsa, block_q=a.block_q))
            args["kernel"] = args["sparse"]
        t = _median_times(fns, args, a.repeats)
        row = (
            f"{frac:>9.0%} {t['dense'] * 1e3:>9.2f} {t['masked'] * 1e3:>10.2f} "
            f"{t['sparse'] * 1e3:>10.2f} {t['dense'] / t['sparse']:>8.2f}x "
            f"{t['masked'] / t['sparse']:>9.2f}x"
        )
        if "kernel" in t:
            row += f" {t['kernel'] * 1e3:>10.2f}"
        print(row)


if __name__ == "__main__":
    main()
