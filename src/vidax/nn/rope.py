"""Rotary position embeddings over video grids (t, h, w), interleaved-pair convention.

Positions are floats so that callers can place a reduced grid on full-resolution coordinates
(DVG) or offset time for autoregressive chunks (Sparse Forcing).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float


def wan_axes_dims(head_dim: int) -> tuple[int, int, int]:
    """Wan's split of head_dim over (t, h, w): h = w = 2*(k//6), t takes the rest."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def video_positions(
    t: int,
    h: int,
    w: int,
    *,
    offset: tuple[float, float, float] = (0.0, 0.0, 0.0),
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0),
) -> Float[Array, "l 3"]:
    """(t*h*w, 3) positions of a row-major token grid: offset + scale * index."""
    axes = [
        o + s * jnp.arange(n, dtype=jnp.float32)
        for n, o, s in zip((t, h, w), offset, scale, strict=True)
    ]
    grid = jnp.stack(jnp.meshgrid(*axes, indexing="ij"), axis=-1)
    return grid.reshape(-1, 3)


def rope_angles(
    positions: Float[Array, "*l a"],
    axes_dims: tuple[int, ...],
    theta: float = 10_000.0,
) -> Float[Array, "*l k/2"]:
    """Rotation angles for each (token, pair): axis `a` uses frequencies theta^(-2j/n_a)."""
    if len(axes_dims) != positions.shape[-1]:
        raise ValueError(f"{len(axes_dims)} rope axes for positions of shape {positions.shape}")
    parts = []
    for a, n in enumerate(axes_dims):
        if n % 2:
            raise ValueError(f"rope axis dims must be even, got {axes_dims}")
        freqs = theta ** (-jnp.arange(0, n, 2, dtype=jnp.float32) / n)
        freqs = jnp.expand_dims(freqs, tuple(range(positions.ndim - 1)))
        parts.append(positions[..., a : a + 1].astype(jnp.float32) * freqs)
    return jnp.concatenate(parts, axis=-1)


def apply_rope(
    x: Float[Array, "b l n k"], angles: Float[Array, "l k/2"]
) -> Float[Array, "b l n k"]:
    """Rotates every head's interleaved pairs by its token's angles (`rotate_pairs`).

    `angles` is (l, k/2) shared over the batch, or (b, l, k/2).
    """
    if angles.ndim == 2:
        angles = angles[None]
    return rotate_pairs(x, angles[:, :, None, :])


def rotate_pairs(
    x: Float[Array, "... k"], angles: Float[Array, "... k/2"]
) -> Float[Array, "... k"]:
    """Rotates interleaved pairs (x[2j], x[2j+1]) by `angles[..., j]`, in float32.

    Args:
      x: (..., k) in any float dtype (the result keeps it).
      angles: (..., k/2), broadcasting against x's pairs: rotate arrays in the shape they
        have (a TPU pads a size-1 axis in front of k to a full tile: a per-head cache of
        blocks reshaped to (b * n, tokens, 1, k) took 1.3x the time and 1.5x the memory).
    """
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)
