"""Rotary position embeddings over video grids (t, h, w), interleaved-pair convention.

Positions are floats so that callers can place a reduced grid on full-resolution coordinates
(DVG) or offset time for autoregressive chunks (Sparse Forcing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
    *,
    per_lane: bool = False,
) -> Float[Array, "*l k/2"] | Float[Array, "*l k"]:
    """Rotation angles for each (token, pair): axis `a` uses frequencies theta^(-2j/n_a).

    With `per_lane`, (..., k): pair j's angle at both of its lanes 2j and 2j+1, each lane
    picking its position axis by a select, so that nothing interleaves: the layout for angles as
    large as the keys they rotate (per-head cache positions), where a TPU would otherwise move
    the keys between lanes and sublanes (`apply_rope`). The same products as the pairs'.
    """
    if len(axes_dims) != positions.shape[-1]:
        raise ValueError(f"{len(axes_dims)} rope axes for positions of shape {positions.shape}")
    if any(n % 2 for n in axes_dims):
        raise ValueError(f"rope axis dims must be even, got {axes_dims}")
    freqs = [theta ** (-jnp.arange(0, n, 2, dtype=jnp.float32) / n) for n in axes_dims]
    positions = positions.astype(jnp.float32)
    if per_lane:
        lanes = (1,) * (positions.ndim - 1) + (-1,)
        axis = jnp.asarray(np.repeat(np.arange(len(axes_dims)), axes_dims)).reshape(lanes)
        lane_freqs = jnp.repeat(jnp.concatenate(freqs), 2).reshape(lanes)
        picked = positions[..., :1]
        for a in range(1, len(axes_dims)):
            picked = jnp.where(axis == a, positions[..., a : a + 1], picked)
        return picked * lane_freqs
    expand = lambda f: jnp.expand_dims(f, tuple(range(positions.ndim - 1)))
    parts = [positions[..., a : a + 1] * expand(f) for a, f in enumerate(freqs)]
    return jnp.concatenate(parts, axis=-1)


def apply_rope(
    x: Float[Array, "b l n k"], angles: Float[Array, "l k/2"] | Float[Array, "l k"]
) -> Float[Array, "b l n k"]:
    """Rotates every head's interleaved pairs by its token's angles (`rotate_pairs`).

    `angles` is (l, k/2) per pair or (l, k) per lane, shared over the batch, or (b, l, ...).
    """
    if angles.ndim == 2:
        angles = angles[None]
    return rotate_pairs(x, angles[:, :, None, :])


def rotate_pairs(
    x: Float[Array, "... k"],
    angles: Float[Array, "... k/2"] | Float[Array, "... k"],
    *,
    lane_dense: bool | None = None,
) -> Float[Array, "... k"]:
    """Rotates interleaved pairs (x[2j], x[2j+1]) by pair j's angle, in float32.

    Args:
      x: (..., k) in any float dtype (the result keeps it).
      angles: broadcasting against x, per pair (..., k/2) or per lane (..., k, as
        `rope_angles(per_lane=True)` gives them).
      lane_dense: which of two layouts of the same arithmetic (equal up to float32 rounding of
        the sums) runs; default `lane_dense_rope()`, on a TPU:
        - pairs: split x into (x1, x2) and stack (x1 cos - x2 sin, x1 sin + x2 cos). Fastest
          on a CPU (1.6x the lane-dense form for a Wan-480p chunk); a TPU lays split pairs out
          with the tokens on its lanes: a transpose of x there and back (4 ms a layer for a
          Wan-480p sparse cache).
        - lane-dense: `x * cos + swap_pairs(x) * (-sin, +sin, ...)`, k on the lanes throughout,
          cos and sin computed per lane (twice per pair).
    """
    k = x.shape[-1]
    if angles.shape[-1] not in (k, k // 2):
        raise ValueError(f"rope angles {angles.shape} for head dim {k}: expected k/2 or k")
    if lane_dense is None:
        lane_dense = lane_dense_rope()
    xf = x.astype(jnp.float32)
    if not lane_dense:
        if angles.shape[-1] == k:
            angles = angles[..., ::2]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        pairs = xf.reshape(*x.shape[:-1], -1, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return out.reshape(x.shape).astype(x.dtype)
    if angles.shape[-1] == k // 2:
        angles = jnp.repeat(angles, 2, axis=-1)
    lanes = (1,) * (angles.ndim - 1) + (k,)
    sign = jnp.where(jnp.arange(k) % 2 == 0, -1.0, 1.0).reshape(lanes)  # x1 cos - x2 sin | ...
    return (xf * jnp.cos(angles) + swap_pairs(xf) * (jnp.sin(angles) * sign)).astype(x.dtype)


def lane_dense_rope() -> bool:
    """Whether `apply_rope` and per-lane angles are the faster layout here: on a TPU."""
    return jax.devices()[0].platform == "tpu"


def swap_pairs(x: Float[Array, "... k"]) -> Float[Array, "... k"]:
    """(x1, x0, x3, x2, ...): each interleaved pair swapped, by two lane rolls and a select."""
    even = (jnp.arange(x.shape[-1]) % 2 == 0).reshape((1,) * (x.ndim - 1) + (-1,))
    return jnp.where(even, jnp.roll(x, -1, axis=-1), jnp.roll(x, 1, axis=-1))
