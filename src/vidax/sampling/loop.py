"""The denoising loop, classifier-free guidance and rectified-flow algebra.

    solver = make_solver("unipc", 50, shift=5.0)
    velocity = classifier_free_guidance(model_fn, context, negative_context, 5.0)
    x0 = jax.jit(lambda x: sample(velocity, x, solver))(noise)

`sample` is one `lax.fori_loop` over the steps, so under `jax.jit` the whole trajectory is a single
compiled program (the step index is traced; the solver's tables are constants).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from vidax.sampling import step_cache
from vidax.sampling.schedulers import Solver

VelocityFn = Callable[[jax.Array, jax.Array], jax.Array]


def predict_x0(x: jax.Array, sigma, v: jax.Array) -> jax.Array:
    """The clean sample implied by a velocity: x₀ = x − σ·v (since x = (1−σ)x₀ + σε, v = ε − x₀).

    Args:
      x: (b, t, h, w, c) latent at noise level sigma.
      sigma: scalar or an array broadcastable to x (e.g. (b, 1, 1, 1, 1)).
      v: velocity, x's shape.
    """
    return x - jnp.asarray(sigma, x.dtype) * v.astype(x.dtype)


def renoise(x0: jax.Array, noise: jax.Array, sigma) -> jax.Array:
    """Puts a clean sample back on the flow at noise level sigma: (1−σ)·x₀ + σ·ε.

    Args:
      x0: (b, t, h, w, c) clean latent.
      noise: ε, x0's shape.
      sigma: scalar or an array broadcastable to x0.
    """
    sigma = jnp.asarray(sigma, x0.dtype)
    return (1 - sigma) * x0 + sigma * noise.astype(x0.dtype)


def sample_steps(
    velocity_fn: VelocityFn,
    x: jax.Array,
    solver: Solver,
    state: Any,
    *,
    start: int,
    stop: int,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> tuple[jax.Array, Any]:
    """Runs solver steps [start, stop) from a given solver state; returns (x, state).

    Carrying the returned state into the next segment continues one trajectory exactly (also
    for multistep solvers); `solver.init(x)` instead restarts the solver's history at `start`.

    Args:
      velocity_fn: v = velocity_fn(x, t) with t the scalar float32 `solver.timesteps[i]`.
      x: (b, t, h, w, c) latent at `solver.sigmas[start]`.
      solver: a `vidax.sampling` solver.
      state: the solver state at `start`.
      start / stop: step range, 0 <= start <= stop <= N (Python ints).
      on_step: host callback `on_step(i)` after each step, through `jax.debug.callback`.
      skip: (N,) static bools: steps that reuse the previous step's velocity instead of calling
        `velocity_fn` (`vidax.sampling.step_cache`); None: every step calls it.
    """
    if skip is not None and any(skip):
        x, state, _ = step_cache.cached_steps(
            velocity_fn, x, solver, state, skip, start=start, stop=stop, on_step=on_step
        )
        return x, state
    n = solver.num_steps
    if not (0 <= start <= stop <= n):
        raise ValueError(f"need 0 <= start <= stop <= num_steps={n}, got start={start} stop={stop}")

    def body(i, carry):
        x, state = solver_step(velocity_fn, carry[0], carry[1], solver, i)
        if on_step is not None:
            jax.debug.callback(lambda i: on_step(int(i)), i)
        return x, state

    return jax.lax.fori_loop(start, stop, body, (x, state))


def solver_step(
    velocity_fn: VelocityFn, x: jax.Array, state: Any, solver: Solver, i
) -> tuple[jax.Array, Any]:
    """Step `i` (may be traced) of `sample_steps`: one velocity, one solver update; returns
    (x, state).

    A host loop over steps compiles this once (i traced) and reports progress between calls:
    a program with a host callback (`on_step` inside the loop) is never written to jax's
    persistent compilation cache, so every new process would compile it again.
    """
    v = velocity_fn(x, jnp.asarray(solver.timesteps)[i])
    if v.shape != x.shape:
        raise ValueError(f"velocity_fn returned shape {v.shape} for a latent of {x.shape}")
    return solver.step(state, i, x, v)


def carried_step(
    velocity_fn: VelocityFn,
    x: jax.Array,
    state: Any,
    memory: Any,
    solver: Solver,
    reuse_at,
    i,
) -> tuple[jax.Array, Any, Any]:
    """What a host loop runs per step, one carry shape either way: `solver_step` (`reuse_at`
    None; `memory`, then None, passes through), or the step cache's `cached_step` with its
    `memory` (`reuse_at` from `step_cache.reuse_mask` of a segment starting at step 0).
    Returns (x, state, memory)."""
    if reuse_at is None:
        x, state = solver_step(velocity_fn, x, state, solver, i)
        return x, state, memory
    return step_cache.cached_step(velocity_fn, x, state, memory, solver, reuse_at, 0, i)


def sample(
    velocity_fn: VelocityFn,
    x: jax.Array,
    solver: Solver,
    *,
    start: int = 0,
    stop: int | None = None,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> jax.Array:
    """Integrates the flow ODE over steps [start, stop) with a fresh solver state.

    Call it inside `jax.jit` to compile the whole loop once. Starting at start > 0 restarts a
    multistep solver's history (first order again); to continue a trajectory across segments,
    use `sample_steps` and carry its state.

    Args:
      velocity_fn: v = velocity_fn(x, t), t the scalar float32 timestep `solver.timesteps[i]`,
        v of x's shape (flow prediction ε − x₀).
      x: (b, t, h, w, c) latent at `solver.sigmas[start]` (pure noise for start = 0).
      solver: a `vidax.sampling` solver (`make_solver`, `FlowEuler`, `UniPC`).
      start / stop: step range (default: the whole schedule).
      on_step: host callback `on_step(i)` after each step (progress bars).
      skip: steps that reuse the previous velocity (see `sample_steps`).

    Returns:
      x at `solver.sigmas[stop]`, x's shape and dtype.
    """
    stop = solver.num_steps if stop is None else stop
    x, _ = sample_steps(
        velocity_fn, x, solver, solver.init(x), start=start, stop=stop, on_step=on_step, skip=skip
    )
    return x


@dataclasses.dataclass(frozen=True)
class ExpertGuidance:
    """The guidance scale of a two-expert model (Wan 2.2 A14B): `high` while the timestep is
    >= `boundary` (the high-noise expert's steps), `low` after. Hashable: a static value of the
    compiled samplers."""

    high: float
    low: float
    boundary: float

    def at(self, t: jax.Array) -> jax.Array:
        """The scale at timestep t (scalar, may be traced)."""
        return jnp.where(jnp.asarray(t) >= self.boundary, self.high, self.low)


def static_guidance(scale: float | ExpertGuidance) -> float | ExpertGuidance:
    """A guidance scale as compiled samplers key on it: a float, or an `ExpertGuidance` whose
    two scales differ (equal scales are that float)."""
    if isinstance(scale, ExpertGuidance):
        if scale.high == scale.low:
            return float(scale.high)
        return ExpertGuidance(float(scale.high), float(scale.low), float(scale.boundary))
    return float(scale)


def classifier_free_guidance(
    model_fn: Callable[[jax.Array, jax.Array, Any], jax.Array],
    context: Any,
    negative_context: Any | None,
    scale: float | jax.Array | ExpertGuidance,
) -> VelocityFn:
    """A velocity_fn that guides `model_fn` with one batched forward per step.

    v = v_u + scale·(v_c − v_u), where [v_c; v_u] = model_fn([x; x], t, [context; negative]).
    Without a negative context, or with scale == 1 (a Python number), a single unguided forward.

    Args:
      model_fn: model_fn(x (b', ...), t (b',) float32, context) -> v (b', ...).
      context: conditioning pytree, leaves batched along axis 0 like x.
      negative_context: the unconditional branch, same structure and shapes (or None).
      scale: guidance scale g (may be traced; then guidance always runs), or an
        `ExpertGuidance` (g by timestep).
    """

    def timesteps(x, t):
        return jnp.broadcast_to(jnp.asarray(t, jnp.float32), (x.shape[0],))

    if negative_context is None or (isinstance(scale, (int, float)) and scale == 1):
        return lambda x, t: model_fn(x, timesteps(x, t), context)

    # PyTreeDef lives in a compiled module jaxlib ships without a stub: mypy cannot resolve it.
    if jax.tree.structure(context) != jax.tree.structure(negative_context):  # type: ignore[operator]
        raise ValueError(
            "context and negative_context must have the same structure, got "
            f"{jax.tree.structure(context)} and {jax.tree.structure(negative_context)}"
        )
    both = jax.tree.map(lambda c, n: jnp.concatenate([c, n], axis=0), context, negative_context)

    def velocity(x, t):
        b = x.shape[0]
        xx = jnp.concatenate([x, x], axis=0)
        out = model_fn(xx, timesteps(xx, t), both)
        g = scale.at(t) if isinstance(scale, ExpertGuidance) else scale
        return cfg_combine(out[:b], out[b:], g)

    return velocity


def cfg_combine(cond: jax.Array, uncond: jax.Array, scale: float | jax.Array) -> jax.Array:
    """Classifier-free guidance of two velocities: uncond + scale (cond - uncond), in their
    dtype."""
    return uncond + jnp.asarray(scale, cond.dtype) * (cond - uncond)
