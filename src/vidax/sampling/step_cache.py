"""Step caching: skip a denoising step's model forward when the model's output is predictable
from the steps before (the MagCache / TeaCache / TaylorSeer family, training-free).

A skipped step forecasts the velocity linearly in the timestep from the last two computed ones
(the last one alone while there is only one). On the 1.1 M-parameter `tiny`, whose output moves
8-25% per step, reusing the last output as it is drifts 10% from the full sampler at 20 steps
and 40% skipped; the forecast drifts 1-5% (benchmarks/step_cache.py).

Which steps to skip is decided ahead of the run, from a calibration: one full run of the same
sampler records, per step, the relative error the forecast would have made there
(`relative_change(forecast, v)`, mean absolute error over the mean absolute forecast).
`plan_skips` skips the steps with the smallest recorded error, keeping a chosen fraction of the
forwards, never two skips in a row, never in the warm-up steps, never the last step. The skip
list is static, so the loop compiles once per plan and a skipped step runs no model forward
(`lax.cond`).

    x, state, errors = cached_steps(velocity, x, solver, solver.init(x), (False,) * n,
                                    start=0, stop=n)        # a full run that calibrates
    skip = plan_skips(errors, keep=0.6)                       # 40% of the forwards skipped
    x, state, _ = cached_steps(velocity, x, solver, solver.init(x), skip, start=0, stop=n)

An all-False skip list is the plain sampler, bit for bit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vidax.sampling.schedulers import Solver

# Fraction of the model forwards `plan_skips` keeps by default (the rest reuse an output).
DEFAULT_KEEP = 0.6
# The first steps set the layout of the video: always computed (MagCache's retention ratio).
WARMUP = 0.2


def relative_change(previous: jax.Array, current: jax.Array) -> jax.Array:
    """mean|current - previous| / mean|previous|: a scalar float32."""
    num = jnp.mean(jnp.abs(current - previous))
    return (num / jnp.maximum(jnp.mean(jnp.abs(previous)), 1e-12)).astype(jnp.float32)


def plan_skips(
    changes: Sequence[float] | np.ndarray,
    keep: float = DEFAULT_KEEP,
    *,
    warmup: float = WARMUP,
    warn: bool = True,
) -> tuple[bool, ...]:
    """Which steps reuse the previous step's output, from a calibration run's changes.

    Args:
      changes: (n,) the calibration: each step's relative forecast error (as `cached_steps`
        records it; NaN or any value at step 0, which is never skipped).
      keep: fraction of the n forwards to run, in (0, 1]; 1 skips nothing.
      warmup: fraction of the first steps always computed.
      warn: warn when the rules allow fewer skips than `keep` asks (off for a default keep).

    Returns:
      (n,) bools. Fewer skips than asked, with a warning, when the rules leave too few
      candidates (no skip in the warm-up, none at the last step, never two in a row).
    """
    changes = np.asarray(changes, np.float64)
    n = len(changes)
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    wanted = n - math.ceil(keep * n)
    first = max(1, math.ceil(warmup * n))
    candidates = [i for i in range(first, n - 1) if np.isfinite(changes[i])]
    skip = [False] * n
    for i in sorted(candidates, key=lambda i: (changes[i], i)):
        if sum(skip) >= wanted:
            break
        if not skip[i - 1] and not skip[i + 1]:
            skip[i] = True
    if warn and sum(skip) < wanted:
        warnings.warn(
            f"keep {keep:.3g} asks to skip {wanted} of {n} forwards; the step cache skips at most "
            f"{sum(skip)} (none in the first {first}, not the last, never two in a row): running "
            f"{n - sum(skip)} forwards",
            stacklevel=2,
        )
    return tuple(skip)


def uniform_skips(steps: int, keep: float = DEFAULT_KEEP) -> tuple[bool, ...]:
    """The skip plan `plan_skips` makes for a calibration in which every step changes alike:
    the plan its rules alone place (none in the warm-up, not the last step, never two in a
    row). A stated skip rate for timing and FLOP counts on models whose weights are absent."""
    changes = np.ones(steps)
    changes[0] = np.nan
    return plan_skips(changes, keep, warn=False)


def cached_steps(
    velocity_fn: Callable[[jax.Array, jax.Array], jax.Array],
    x: jax.Array,
    solver: Solver,
    state: Any,
    skip: Sequence[bool],
    *,
    start: int,
    stop: int,
    on_step: Callable[[int], None] | None = None,
) -> tuple[jax.Array, Any, jax.Array]:
    """`vidax.sampling.sample_steps` that forecasts the velocity at the steps `skip` marks
    instead of calling `velocity_fn`.

    The first step of the segment always runs the model (nothing to reuse yet).

    Args:
      velocity_fn / x / solver / state / start / stop / on_step: as `sample_steps`.
      skip: (num_steps,) static bools, indexed by the solver's step.

    Returns:
      (x, solver state, errors): errors (num_steps,) float32, at each computed step the
      relative error the forecast from the earlier computed steps would have made (NaN where
      not measured: skipped steps, the segment's first step, steps outside [start, stop)).
    """
    n = solver.num_steps
    if not (0 <= start <= stop <= n):
        raise ValueError(f"need 0 <= start <= stop <= num_steps={n}, got start={start} stop={stop}")
    reuse_at = reuse_mask(skip, start, n)

    def body(i, carry):
        x, state, memory = carry
        carry = cached_step(velocity_fn, x, state, memory, solver, reuse_at, start, i)
        if on_step is not None:
            jax.debug.callback(lambda i: on_step(int(i)), i)
        return carry

    x, state, memory = jax.lax.fori_loop(start, stop, body, (x, state, init_memory(x, n)))
    return x, state, memory[1]


def reuse_mask(skip: Sequence[bool], start: int, num_steps: int) -> np.ndarray:
    """(num_steps,) bools: the steps of a segment from `start` that forecast (a segment's first
    step always computes)."""
    if len(skip) != num_steps:
        raise ValueError(f"skip has {len(skip)} entries for {num_steps} steps")
    return np.asarray([bool(s) and i > start for i, s in enumerate(skip)])


def init_memory(x: jax.Array, num_steps: int) -> tuple:
    """What `cached_step` carries besides x and the solver state: the last two computed
    velocities with their timesteps and how many there were, and the (num_steps,) errors."""
    zero, t0 = jnp.zeros(x.shape, jnp.float32), jnp.float32(0)
    return (zero, t0, zero, t0, jnp.int32(0)), jnp.full((num_steps,), jnp.nan, jnp.float32)


def cached_step(
    velocity_fn: Callable[[jax.Array, jax.Array], jax.Array],
    x: jax.Array,
    state: Any,
    memory: tuple,
    solver: Solver,
    reuse_at: np.ndarray,
    start: int,
    i,
) -> tuple[jax.Array, Any, tuple]:
    """Step `i` (may be traced) of `cached_steps`: returns (x, state, memory); `reuse_at` from
    `reuse_mask`, `memory` from `init_memory` (or the step before)."""
    # last / before: the last two computed velocities and their timesteps.
    (last, t_last, before, t_before, computed), changes = memory
    reuse = jnp.asarray(reuse_at)[i]
    t = jnp.asarray(solver.timesteps, jnp.float32)[i]
    # A skipped step extrapolates the velocity linearly in t from the last two computed
    # ones (the last one alone while there is only one).
    slope = jnp.where(computed >= 2, (last - before) / (t_last - t_before), 0.0)
    forecast = last + slope * (t - t_last)
    v = jax.lax.cond(reuse, lambda: forecast, lambda: velocity_fn(x, t).astype(jnp.float32))
    # What skipping this step would have cost: the forecast's error.
    measured = jnp.where(reuse | (i == start), jnp.nan, relative_change(forecast, v))
    history = jax.lax.cond(
        reuse,
        lambda: (last, t_last, before, t_before, computed),
        lambda: (v, t, last, t_last, computed + 1),
    )
    x, state = solver.step(state, i, x, v.astype(x.dtype))
    return x, state, (history, changes.at[i].set(measured))
