"""Moving latents and noise between nested grids, and the re-noise at a stage boundary.

**Grids.** A temporal factor f keeps the frames {0, f, 2f, ...}; a spatial factor f keeps h/f x
w/f samples whose centres sit at full-resolution coordinate f*i + (f - 1)/2. Every axis has
three linear operators, built once on the host (`axis_operators`):

- `data` (m, n): a signal on the coarse grid. Time: the nested frames. Space: the low-pass
  image, either "dct" (keep the m lowest orthonormal DCT-II coefficients, inverse at m samples,
  divided by sqrt(f) to keep amplitudes: an ideal low-pass with mirrored borders) or box
  averaging (for the `jax.image.resize` methods).
- `noise` (m, n): the same subspace with orthonormal rows, so white unit noise stays white with
  unit variance (box: the f-average times sqrt(f); time: (U^T U)^(-1/2) U^T for the temporal
  interpolation U). It is the part of the full-resolution noise the coarse grid can represent.
- `prolong` (n, m): back to the full grid (DCT zero-padding, linear/nearest frames, or a
  `jax.image.resize` method). Between two nested grids a signal moves by data(fine) @ prolong.

**Resolution-dependent shift (why the coarse grid is less noisy).** Restricting
x_sigma = (1 - sigma) x0 + sigma eps with `data` keeps a smooth x0 and, in space, divides the
noise by f (the noise restriction is f times the data restriction): see `vidax.dvg.schedule`.

**Transition at a stage boundary.** A coarse stage ends with the model's clean prediction x0
and noise prediction eps_hat = (x - (1 - sigma) x0) / sigma at its last level sigma
(x = (1 - sigma) x0 + sigma eps_hat exactly). The next grid starts at sigma':

    x' = (1 - sigma') * prolong(x0) + sigma' * eps',
    eps' = restrict_noise(eps_full),   eps_full <- eps_full + embed(eps_hat - noise(eps_full)).

`eps_full` is the run's starting noise with its coarse-grid component replaced by the noise the
coarse stage actually denoised towards (`correct_noise`): on the coarse subspace x' is then the
deterministic (DDIM/Euler) continuation of the coarse trajectory, which preserves the flow's
marginal; the complement, which the coarse grid never saw, keeps its share of the starting
noise: fresh, white and independent of x0, so given x0 it has the conditional marginal
N((1 - sigma') x0, sigma'^2 I) there. Using the starting noise (rather than new draws) keeps a
seed's video close to the full-resolution sampler's. On an exact Gaussian denoiser this
transition tracks the full-resolution ODE far better than re-noising with the restricted
starting noise or fresh noise alone (both remain available: `Plan.noise`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from vidax.sampling import renoise

__all__ = [
    "SPATIAL_METHODS",
    "TEMPORAL_METHODS",
    "AxisOperators",
    "axis_operators",
    "correct_noise",
    "downsample",
    "positions",
    "renoise",
    "restrict_noise",
    "upsample",
]

TEMPORAL_METHODS = ("linear", "nearest")
SPATIAL_METHODS = ("dct", "nearest", "linear", "cubic", "lanczos3", "lanczos5")


@dataclasses.dataclass(frozen=True, eq=False)
class AxisOperators:
    """One axis' operators (float64 NumPy, read-only): data (m, n), noise (m, n), prolong (n, m)."""

    data: np.ndarray
    noise: np.ndarray
    prolong: np.ndarray


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float64)
    a.flags.writeable = False
    return a


def _inverse_sqrt(m: np.ndarray) -> np.ndarray:
    lam, v = np.linalg.eigh(m)
    return (v / np.sqrt(lam)) @ v.T


def _dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II: coefficients = M @ x."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2 / n)
    m[0] /= math.sqrt(2)
    return m


def _frame_interpolation(n: int, f: int, method: str) -> np.ndarray:
    """(n, m) interpolation from the nested frames {0, f, ...} to all n frames."""
    m = (n - 1) // f + 1
    u = np.zeros((n, m))
    for j in range(n):
        lo, a = divmod(j, f)
        if a == 0:
            u[j, lo] = 1.0
        elif method == "linear":
            u[j, lo], u[j, lo + 1] = 1 - a / f, a / f
        else:  # nearest (ties to the earlier frame)
            u[j, lo + (1 if a > f / 2 else 0)] = 1.0
    return u


def _resize_matrix(m: int, n: int, method: str) -> np.ndarray:
    """(n, m) `jax.image.resize` of each coarse basis vector (half-pixel centres)."""
    with jax.ensure_compile_time_eval():
        basis = jax.image.resize(jnp.eye(m, dtype=jnp.float32), (m, n), method=method)
    return np.asarray(basis, np.float64).T


@functools.cache
def axis_operators(n: int, factor: int, axis: str, method: str) -> AxisOperators:
    """The operators of one axis of length n reduced by `factor`.

    Args:
      n: full-resolution length.
      factor: reduction (1: identities); time needs (n - 1) % factor == 0, space n % factor == 0.
      axis: "time" or "space".
      method: `TEMPORAL_METHODS` for time, `SPATIAL_METHODS` for space.
    """
    if factor == 1:
        eye = np.eye(n)
        return AxisOperators(_frozen(eye), _frozen(eye), _frozen(eye))
    if axis == "time":
        if method not in TEMPORAL_METHODS:
            raise ValueError(f"temporal method must be one of {TEMPORAL_METHODS}, got {method!r}")
        u = _frame_interpolation(n, factor, method)
        noise = _inverse_sqrt(u.T @ u) @ u.T
        return AxisOperators(_frozen(np.eye(n)[::factor]), _frozen(noise), _frozen(u))
    if method not in SPATIAL_METHODS:
        raise ValueError(f"spatial method must be one of {SPATIAL_METHODS}, got {method!r}")
    m = n // factor
    if method == "dct":
        truncate = _dct_matrix(m).T @ _dct_matrix(n)[:m]  # (m, n), orthonormal rows
        root = math.sqrt(factor)
        return AxisOperators(
            _frozen(truncate / root), _frozen(truncate), _frozen(truncate.T * root)
        )
    box = np.kron(np.eye(m), np.full((1, factor), 1.0 / factor))
    prolong = np.repeat(np.eye(m), factor, axis=0) if method == "nearest" else None
    if prolong is None:
        prolong = _resize_matrix(m, n, method)
    return AxisOperators(_frozen(box), _frozen(box * math.sqrt(factor)), _frozen(prolong))


def _operators(latent, factors, temporal, spatial) -> tuple[AxisOperators, ...]:
    t, h, w = latent
    ft, fs = factors
    return (
        axis_operators(t, ft, "time", temporal),
        axis_operators(h, fs, "space", spatial),
        axis_operators(w, fs, "space", spatial),
    )


def _apply(mats, x: jax.Array) -> jax.Array:
    """Applies one (m, n) matrix per (t, h, w) axis of a (b, t, h, w, c) array (float32 math,
    full precision: these are exact resamplings, not model compute)."""
    y = x.astype(jnp.float32)
    for axis, m in zip((1, 2, 3), mats, strict=True):
        if m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(m.shape[0])):
            continue
        y = jnp.moveaxis(
            jnp.tensordot(
                jnp.asarray(m, jnp.float32),
                y,
                axes=([1], [axis]),
                precision=jax.lax.Precision.HIGHEST,
            ),
            0,
            axis,
        )
    return y.astype(x.dtype)


def restrict_noise(
    noise: Float[Array, "b t h w c"],
    factors: tuple[int, int],
    *,
    temporal: str = "linear",
    spatial: str = "dct",
) -> Float[Array, "b t2 h2 w2 c"]:
    """The component of full-resolution white noise on a reduced grid (still white, unit
    variance: the operator has orthonormal rows)."""
    ops = _operators(noise.shape[1:4], factors, temporal, spatial)
    return _apply([o.noise for o in ops], noise)


def downsample(
    x: Float[Array, "b t h w c"],
    factors: tuple[int, int],
    *,
    temporal: str = "linear",
    spatial: str = "dct",
) -> Float[Array, "b t2 h2 w2 c"]:
    """A signal on the reduced grid (nested frames; low-passed, amplitude-preserving pixels)."""
    ops = _operators(x.shape[1:4], factors, temporal, spatial)
    return _apply([o.data for o in ops], x)


def upsample(
    x: Float[Array, "b t h w c"],
    latent: tuple[int, int, int],
    source: tuple[int, int],
    target: tuple[int, int] = (1, 1),
    *,
    temporal: str = "linear",
    spatial: str = "dct",
) -> Float[Array, "b T H W c"]:
    """Moves a signal from the grid `source` (factors) to the finer nested grid `target`.

    Args:
      x: (b, t', h', w', c) on the source grid of the full latent `latent` (t, h, w).
      latent: the full-resolution (t, h, w).
      source / target: (t_factor, s_factor) of the two grids; each target factor divides the
        source's.
      temporal / spatial: the methods (`TEMPORAL_METHODS`, `SPATIAL_METHODS`).

    Returns:
      (b, t'', h'', w'', c) on the target grid, x's dtype.
    """
    if any(a % b for a, b in zip(source, target, strict=True)):
        raise ValueError(f"grid {target} is not nested in {source}")
    src = _operators(latent, source, temporal, spatial)
    dst = _operators(latent, target, temporal, spatial)
    expected = tuple(o.data.shape[0] for o in src)
    if tuple(x.shape[1:4]) != expected:
        raise ValueError(f"x has grid {tuple(x.shape[1:4])}, expected {expected} for {source}")
    return _apply([d.data @ s.prolong for d, s in zip(dst, src, strict=True)], x)


def correct_noise(
    noise: Float[Array, "b t h w c"],
    predicted: Float[Array, "b t2 h2 w2 c"],
    factors: tuple[int, int],
    *,
    temporal: str = "linear",
    spatial: str = "dct",
) -> Float[Array, "b t h w c"]:
    """Full-resolution noise whose component on a reduced grid is replaced by `predicted`.

    noise + N^T (predicted - N noise), N the grid's noise restriction (orthonormal rows): the
    result restricts to `predicted` on that grid and equals `noise` on the complement.
    """
    ops = _operators(noise.shape[1:4], factors, temporal, spatial)
    residual = predicted - _apply([o.noise for o in ops], noise)
    return noise + _apply([o.noise.T for o in ops], residual)


def positions(
    grid: tuple[int, int, int], factors: tuple[int, int], patch: tuple[int, int, int]
) -> np.ndarray:
    """RoPE positions (l, 3) of a reduced token grid in full-resolution token coordinates.

    A reduced token j covers latent samples whose centre lies at full-resolution token coordinate
    fs*j + (fs - 1)/2 in h and w, and (temporal patch 1) at frame ft*j, so the model sees the
    geometry of the full grid at a coarser sampling. Built on the host (a compile-time constant).

    Args:
      grid: (t', h', w') token grid of the (padded) reduced latent.
      factors: (t_factor, s_factor).
      patch: the DiT's (pt, ph, pw).

    Returns:
      (t' h' w', 3) float32, row-major like `vidax.nn.video_positions`.
    """
    ft, fs = factors
    pt = patch[0]
    offsets = ((pt - 1) * (ft - 1) / (2 * pt), (fs - 1) / 2, (fs - 1) / 2)
    axes = [
        o + s * np.arange(n, dtype=np.float64)
        for n, o, s in zip(grid, offsets, (ft, fs, fs), strict=True)
    ]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    return mesh.reshape(-1, 3).astype(np.float32)
