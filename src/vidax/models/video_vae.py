"""Building blocks shared by the causal 3D video VAEs (Wan 2.1, HunyuanVideo, HunyuanVideo-1.5).

Host-side parameter initialisers, the channel RMS norm, the chunked-in-time driver, the
tile cross-fade and the input checks every VAE applies to videos and latents. Channels-last
throughout: videos and latents are `(b, t, h, w, c)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vidax.nn.layers import last_axis, param

Cache = Any  # a pytree of arrays mirroring the module tree; None before the first chunk

CONV3D_AXES = ("kernel", "kernel", "kernel", "conv_in", "conv_out")
VIDEO_AXES = ("batch", "frames", "height", "width", "channels")


def conv_init(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """torch's default conv init U(+-1/sqrt(fan_in)), kernel layout (..., in, out).

    A concrete key seeds numpy: eager `jax.random` compiles one XLA program per parameter shape,
    which made building even the tiny preset take ~20 s on a CPU. Under tracing (`eval_shape`
    for checkpoint loading, or a user's `jit`) it falls back to jax.random.
    """
    bound = 1 / math.sqrt(math.prod(shape[:-1]))
    if isinstance(key, jax.core.Tracer):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    seed = np.asarray(jax.random.key_data(key)).ravel()
    return jnp.asarray(np.random.default_rng(seed).uniform(-bound, bound, shape), dtype)


def constant(value: float, shape: tuple[int, ...], dtype) -> jax.Array:
    """A filled array made on the host (an eager jnp.full compiles per shape)."""
    return jnp.asarray(np.full(shape, value, np.float32), dtype)


def conv_weights(
    rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], param_dtype
) -> tuple[nnx.Param, nnx.Param]:
    """A conv kernel of `shape` (..., in, out) with torch's default init, and its zero bias."""
    kernel = param(conv_init(rngs.params(), shape, param_dtype), axes)
    return kernel, param(constant(0.0, shape[-1:], param_dtype), ("conv_out",))


class ChannelRMSNorm(nnx.Module):
    """x / ||x|| * sqrt(c) * gamma over channels (torch `F.normalize`, eps 1e-12), in float32."""

    def __init__(self, dim: int, *, param_dtype: jnp.dtype = jnp.float32):
        self.gamma = param(constant(1.0, (dim,), param_dtype), ("norm",))

    def __call__(self, x: Float[Array, "... c"]) -> Float[Array, "... c"]:
        xf = x.astype(jnp.float32)
        sq = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
        scale = jax.lax.rsqrt(jnp.maximum(sq, 1e-24)) * math.sqrt(x.shape[-1])
        gamma = last_axis(self.gamma[...].astype(jnp.float32), x.ndim)
        return (xf * scale * gamma).astype(x.dtype)


def run_chunked(
    fn: Callable[[Array, Cache], tuple[Array, Cache]], x: Float[Array, "b t h w c"], step: int
) -> Array:
    """fn over frame 0 alone, then over `step`-frame chunks in a scan carrying the cache."""
    y0, cache = fn(x[:, :1], None)
    rest = x[:, 1:]
    n = rest.shape[1] // step
    if n == 0:
        return y0
    chunks = rest.reshape(rest.shape[0], n, step, *rest.shape[2:]).swapaxes(0, 1)

    def body(cache, chunk):
        y, cache = fn(chunk, cache)
        return cache, y

    _, ys = jax.lax.scan(body, cache, chunks)
    ys = ys.swapaxes(0, 1)
    ys = ys.reshape(ys.shape[0], ys.shape[1] * ys.shape[2], *ys.shape[3:])
    return jnp.concatenate([y0, ys.astype(y0.dtype)], axis=1)


def stream_through(layers, x: Array, caches: Cache) -> tuple[Array, tuple[Cache, ...]]:
    """One chunk through `layers` in order, each `layer(x, cache) -> (x, cache)`.

    Args:
      caches: one cache per layer from the previous chunk; None at the clip's start.

    Returns:
      The output and the layers' new caches.
    """
    caches = caches or (None,) * len(layers)
    new = []
    for layer, c in zip(layers, caches, strict=True):
        x, c = layer(x, c)
        new.append(c)
    return x, tuple(new)


def stream_stage(resnets, resample: Callable | None, x: Array, cache: Cache) -> tuple[Array, Cache]:
    """One chunk through a stage: its residual blocks, then its resampler (None: none).

    Args:
      cache: (resnet caches, resampler cache) from the previous chunk; None at the clip's start.
    """
    c_res, c_resample = (None, None) if cache is None else cache
    x, c_res = stream_through(resnets, x, c_res)
    if resample is not None:
        x, c_resample = resample(x, c_resample)
    return x, (c_res, c_resample)


def cross_fade(a: Array, b: Array, extent: int, axis: int) -> Array:
    """b with its first `extent` rows along `axis` cross-faded from the last rows of a."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    if extent <= 0:
        return b
    ramp = (jnp.arange(extent, dtype=jnp.float32) / extent).astype(b.dtype)
    ramp = ramp.reshape((1,) * axis + (extent,) + (1,) * (b.ndim - axis - 1))
    tail = jax.lax.slice_in_dim(a, a.shape[axis] - extent, a.shape[axis], axis=axis)
    head = jax.lax.slice_in_dim(b, 0, extent, axis=axis)
    rest = jax.lax.slice_in_dim(b, extent, b.shape[axis], axis=axis)
    mixed = tail * (1 - ramp) + head * ramp
    return jnp.concatenate([mixed, rest], axis=axis)


def check_video(x, *, channels: int, temporal_factor: int, spatial_factor: int) -> None:
    """Raises ValueError unless x is a channels-last video the VAE can encode.

    It must be (b, t, h, w, c) with c == `channels`, t = 1 + `temporal_factor` k frames and
    h, w positive multiples of `spatial_factor`.
    """
    if x.ndim != 5:
        raise ValueError(f"video must be (b, t, h, w, c), got shape {x.shape}")
    _, t, h, w, c = x.shape
    if c != channels:
        raise ValueError(f"video has {c} channels, expected {channels} (channels-last)")
    if t % temporal_factor != 1:
        raise ValueError(f"video must have 1 + {temporal_factor}k frames, got {t}")
    s = spatial_factor
    if h % s or w % s or h < s or w < s:
        raise ValueError(f"video height and width must be positive multiples of {s}, got {h}x{w}")


def check_latents(z, *, z_dim: int) -> None:
    """Raises ValueError unless z is (b, t, h, w, z_dim) latents with no empty axis."""
    if z.ndim != 5:
        raise ValueError(f"latents must be (b, t, h, w, c), got shape {z.shape}")
    if z.shape[-1] != z_dim:
        raise ValueError(f"latents have {z.shape[-1]} channels, expected z_dim={z_dim}")
    if min(z.shape[1:4]) < 1:
        raise ValueError(f"latents have an empty axis: {z.shape}")


class VideoVAE(nnx.Module):
    """The input checks every video VAE runs; its `config` has `in_channels`,
    `temporal_factor`, `spatial_factor` and `z_dim`."""

    config: Any

    def _check_video(self, x) -> None:
        cfg = self.config
        check_video(
            x,
            channels=cfg.in_channels,
            temporal_factor=cfg.temporal_factor,
            spatial_factor=cfg.spatial_factor,
        )

    def _check_latents(self, z) -> None:
        check_latents(z, z_dim=self.config.z_dim)
