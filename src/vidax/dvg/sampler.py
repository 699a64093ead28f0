"""The progressive sampler: every stage of a `Plan` in one jitted program.

    p = plan(Schedule.of([(2, 2, 8), (1, 1, 12)]), latent=(9, 8, 8), patch=(1, 2, 2), solver=s)
    x = jax.jit(lambda noise: sample(velocity_fn, noise, p))(noise)

`sample` unrolls the stages in Python (their shapes differ) and runs each stage's steps with
`vidax.sampling.sample` (a `lax.fori_loop`), so one jit covers the whole schedule and shapes
change only at stage boundaries. `denoise` is the model-level entry (CFG, one compile per plan);
`probe` runs the selector's cheap first steps once and returns a `Probe` that any schedule
starting with the same stage resumes from (`denoise(..., resume=probe)`), so those steps are
never paid twice.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax import progress, sampling
from vidax.dvg import selector
from vidax.dvg.schedule import Plan, Schedule, Stage, StagePlan, reduced_shape
from vidax.dvg.schedule import plan as plan_schedule
from vidax.dvg.selector import DEFAULT_POLICY, ladders, measure
from vidax.dvg.transition import (
    correct_noise,
    downsample,
    positions,
    renoise,
    restrict_noise,
    upsample,
)
from vidax.sharding import current


class PatchedDiT(Protocol):
    """What DVG needs of a DiT (`vidax.models.dit_stages.VideoDiT` is one): its config's
    `patch_size`, and a forward taking the tokens' `positions` (a reduced grid's) and, for
    image-to-video, `condition` channels on the latent's grid."""

    config: Any

    def __call__(
        self, x: jax.Array, timestep: jax.Array, *args: Any, **kwargs: Any
    ) -> jax.Array: ...


@dataclasses.dataclass(frozen=True, eq=False)
class StageGrid:
    """A reduced stage's grid as the model sees it (see `VelocityFn`).

    Attributes:
      factors: (t_factor, s_factor) of the grid.
      pad: (t, h, w) edge padding the model input gets (a multiple for the patch or the mesh).
      positions: (l, 3) RoPE positions of the padded token grid in full-resolution
        coordinates, or None (the model's integer grid: `Plan.rope` "compact"). Built on the
        host: constants of the compiled program.
      temporal / spatial: the plan's resampling methods.
    """

    factors: tuple[int, int]
    pad: tuple[int, int, int]
    positions: np.ndarray | None
    temporal: str
    spatial: str

    def restrict(self, a: jax.Array) -> jax.Array:
        """A full-resolution (b, t, h, w, k) signal on this grid, padded like the model input:
        an image-to-video condition (image latents: nested frames, low-passed pixels; the
        first-frame mask stays one on frame 0 and zero elsewhere, as the reference rebuilds
        it per stage)."""
        y = downsample(a, self.factors, temporal=self.temporal, spatial=self.spatial)
        if any(self.pad):
            y = jnp.pad(y, [(0, 0), *((0, p) for p in self.pad), (0, 0)], mode="edge")
        return y


# velocity_fn(x (b,t,h,w,c), t scalar float32, grid) -> v like x, where grid is the reduced
# stage's `StageGrid`, or None at full resolution (the model's own grid, nothing to restrict).
VelocityFn = Callable[[jax.Array, jax.Array, StageGrid | None], jax.Array]


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=("x0", "eps_hat", "signals"),
    meta_fields=("stage",),
)
@dataclasses.dataclass(frozen=True)
class Probe:
    """Stage 0 of a schedule, run once (`probe`): what the selector measures and what a schedule
    that starts with the same stage resumes from. A pytree (the stage is static metadata).

    Attributes:
      x0 / eps_hat: (b, t', h', w', c) clean and noise predictions of the stage's last step.
      signals: (b, 2) (motion, detail) of x0 (`vidax.dvg.selector.measure`).
      stage: the `Stage` that ran (grid factors and steps).
    """

    x0: jax.Array
    eps_hat: jax.Array
    signals: jax.Array
    stage: Stage

    def resumes(self, schedule: Schedule) -> bool:
        """Whether `schedule` starts with this probe's stage and has more (so can resume)."""
        return len(schedule.stages) > 1 and schedule.stages[0] == self.stage

    def take(self, rows) -> Probe:
        """The probe of a subset of the videos (rows: an index array)."""
        return jax.tree.map(lambda a: a[rows], self)


def stage_velocity(velocity_fn: VelocityFn, plan: Plan, stage: StagePlan):
    """velocity(x, t) on a stage's grid: pads to the planned shape, passes the `StageGrid`
    (RoPE positions on full-resolution coordinates; None at full resolution), crops the
    prediction."""
    if stage.factors == (1, 1) and not any(stage.pad):
        return lambda x, t: velocity_fn(x, t, None)
    padded = stage.padded
    (t, h, w), (pt, ph, pw) = padded, plan.patch
    tokens = (t // pt, h // ph, w // pw)
    pos = positions(tokens, stage.factors, plan.patch) if plan.rope == "scaled" else None
    grid = StageGrid(stage.factors, stage.pad, pos, plan.temporal, plan.spatial)
    t0, h0, w0 = stage.shape

    def velocity(x, t):
        if any(stage.pad):
            widths = [(0, 0), *((0, p) for p in stage.pad), (0, 0)]
            x = jnp.pad(x, widths, mode="edge")
        return velocity_fn(x, t, grid)[:, :t0, :h0, :w0]

    return velocity


def _methods(plan: Plan) -> dict:
    return {"temporal": plan.temporal, "spatial": plan.spatial}


def run_stage(
    velocity_fn: VelocityFn,
    x: jax.Array,
    plan: Plan,
    index: int,
    *,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Runs a reduced (not the last) stage from x at its entry level.

    `skip` (the base schedule's steps, `vidax.sampling.step_cache`) marks steps that reuse the
    previous velocity; a stage's first step and a reduced stage's last step always compute.

    Returns:
      (x0, eps_hat) on the stage's grid: the clean and noise predictions of its last model
      evaluation (see `vidax.dvg.schedule`).
    """
    if index == len(plan.stages) - 1:
        raise ValueError(f"stage {index} is the last stage: run it with run_last_stage")
    velocity, solver, callback, local = _stage_parts(velocity_fn, plan, index, on_step, skip)
    n = solver.num_steps
    x, _ = sampling.sample_steps(
        velocity, x, solver, solver.init(x), start=0, stop=n - 1, on_step=callback, skip=local
    )
    x0, eps_hat = _last_step(velocity, x, solver)
    if callback is not None:
        jax.debug.callback(callback, n - 1)
    return x0, eps_hat


def _last_step(velocity, x: jax.Array, solver) -> tuple[jax.Array, jax.Array]:
    """A reduced stage's last step: (x0, eps_hat) of its model evaluation."""
    # The last update lands on sigma = 0, i.e. on the clean prediction (Euler and UniPC alike);
    # done by hand to keep the noise prediction too.
    n = solver.num_steps
    sigma = jnp.float32(solver.sigmas[n - 1])
    v = velocity(x, jnp.float32(solver.timesteps[n - 1])).astype(x.dtype)
    return x - sigma * v, x + (1 - sigma) * v


def run_last_stage(
    velocity_fn: VelocityFn,
    x: jax.Array,
    plan: Plan,
    *,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> jax.Array:
    """Runs the last (full-resolution) stage from x at its entry level: the (b, t, h, w, c)
    sample. `skip` as for `run_stage`."""
    index = len(plan.stages) - 1
    velocity, solver, callback, local = _stage_parts(velocity_fn, plan, index, on_step, skip)
    return sampling.sample(velocity, x, solver, on_step=callback, skip=local)


def _stage_parts(
    velocity_fn: VelocityFn,
    plan: Plan,
    index: int,
    on_step: Callable[[int], None] | None,
    skip: Sequence[bool] | None,
) -> tuple[
    Callable[[jax.Array, jax.Array], jax.Array],
    sampling.Solver,
    Callable[[int], None] | None,
    tuple[bool, ...] | None,
]:
    """Stage `index`'s velocity, solver, step callback (base-schedule step indices) and skips
    (the stage's own steps)."""
    stage = plan.stages[index]
    callback = None if on_step is None else (lambda i: on_step(i + stage.start))
    local = _stage_skip(plan, index, skip)
    return stage_velocity(velocity_fn, plan, stage), stage.solver, callback, local


def _stage_skip(plan: Plan, index: int, skip: Sequence[bool] | None) -> tuple[bool, ...] | None:
    """The base schedule's `skip` on stage `index`'s own steps (its [start, start + n))."""
    if skip is None:
        return None
    stage = plan.stages[index]
    n = stage.solver.num_steps
    return (tuple(skip[stage.start : stage.start + n]) + (False,) * n)[:n]


def transition(
    x0: jax.Array,
    eps_hat: jax.Array,
    noise: jax.Array,
    plan: Plan,
    index: int,
    *,
    key: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """From stage index - 1's predictions to stage `index`'s starting latent.

    Args:
      x0 / eps_hat: clean and noise predictions on the previous stage's grid.
      noise: (b, t, h, w, c) the full-resolution noise carried so far.
      plan / index: the stage being entered.
      key: PRNG key (noise="fresh").

    Returns:
      (x at the stage's entry level on its grid, the full-resolution noise carried on).
    """
    prev, stage = plan.stages[index - 1], plan.stages[index]
    methods = _methods(plan)
    if plan.noise == "consistent":
        noise = correct_noise(noise, eps_hat, prev.factors, **methods)
    elif plan.noise == "fresh":
        if key is None:
            raise ValueError("noise='fresh' needs a PRNG key")
        noise = jax.random.normal(jax.random.fold_in(key, index), noise.shape, noise.dtype)
    eps = noise if stage.factors == (1, 1) else restrict_noise(noise, stage.factors, **methods)
    up = upsample(x0, plan.latent, prev.factors, stage.factors, **methods)
    return renoise(up, eps, stage.entry_sigma), noise


def sample(
    velocity_fn: VelocityFn,
    noise: jax.Array,
    plan: Plan,
    *,
    key: jax.Array | None = None,
    resume: Probe | None = None,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> jax.Array:
    """Integrates every stage of `plan`; call inside `jax.jit` to compile the schedule once.

    Args:
      velocity_fn: v = velocity_fn(x, t, positions) (see `VelocityFn`).
      noise: (b, t, h, w, c) full-resolution starting noise (restricted to coarse grids).
      plan: the resolved schedule.
      key: PRNG key for `plan.noise == "fresh"`.
      resume: a `Probe` of this plan's stage 0 (same latent): start at stage 1 from it.
      on_step: host callback with the base schedule's step index after each step.
      skip: (base steps,) steps that reuse the previous velocity (`vidax.sampling.step_cache`).

    Returns:
      (b, t, h, w, c) float32 sample.
    """
    stages = plan.stages
    if resume is None:
        first = stages[0]
        if first.factors == (1, 1):
            x = noise
        else:
            x = restrict_noise(noise, first.factors, **_methods(plan))
        start = 0
    else:
        _check_resume(resume, plan)
        x, noise = transition(resume.x0, resume.eps_hat, noise, plan, 1, key=key)
        start = 1
    for index in range(start, len(stages) - 1):
        x0, eps_hat = run_stage(velocity_fn, x, plan, index, on_step=on_step, skip=skip)
        x, noise = transition(x0, eps_hat, noise, plan, index + 1, key=key)
    return run_last_stage(velocity_fn, x, plan, on_step=on_step, skip=skip)


def _check_resume(resume: Probe, plan: Plan) -> None:
    stages = plan.stages
    if not resume.resumes(plan.schedule) or tuple(resume.x0.shape[1:4]) != stages[0].shape:
        raise ValueError(
            f"resume needs a probe of this plan's first stage {plan.schedule.stages[0]} on "
            f"grid {stages[0].shape} and a later stage; got {resume.stage} on grid "
            f"{tuple(resume.x0.shape[1:4])} for {plan.schedule.describe()}"
        )


# -- model-level entry points ---------------------------------------------------------------------


def model_velocity(model, cond, negative, guidance: float) -> VelocityFn:
    """The (guided) `VelocityFn` of a DiT called as `model(x, timestep, **cond, positions=...)`
    (as `vidax.pipeline.denoise`). A `condition` in the conditioning (image-to-video channels
    on the full latent grid) is restricted to each reduced stage's grid."""
    use_cfg = negative is not None and guidance != 1.0

    def on_grid(c, grid: StageGrid | None):
        if grid is None or c is None or c.get("condition") is None:
            return c
        return {**c, "condition": grid.restrict(c["condition"])}

    def velocity(x, t, grid):
        kw = {} if grid is None or grid.positions is None else {"positions": grid.positions}
        c, neg = on_grid(cond, grid), on_grid(negative, grid)

        def model_fn(x, timestep, c):
            return model(x, timestep, **c, **kw).astype(jnp.float32)

        if use_cfg:
            return sampling.classifier_free_guidance(model_fn, c, neg, guidance)(x, t)
        return model_fn(x, jnp.full((x.shape[0],), t, jnp.float32), c)

    return velocity


def denoise(
    model: PatchedDiT,
    noise: jax.Array,
    cond,
    negative,
    *,
    plan: Plan,
    guidance: float,
    key: jax.Array | None = None,
    resume: Probe | None = None,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
) -> jax.Array:
    """Runs a plan with a DiT (one jitted program per plan; with `on_step`, one jitted step per
    call); returns the latent.

    Args:
      model: a DiT called as `model(x, timestep (b,), **cond, positions=(l, 3))`; a
        `condition` in cond is on the full grid (restricted per stage).
      noise: (b, t, h, w, c) starting noise.
      cond / negative: conditioning pytrees (negative None or guidance 1 disables CFG).
      plan: from `vidax.dvg.plan`.
      guidance: classifier-free guidance scale.
      key / resume / on_step: see `sample`.
      skip: (base steps,) steps that reuse the previous velocity (see `sample`).
    """
    graphdef, state = nnx.split(model)
    negative = negative if negative is not None and guidance != 1.0 else None
    scale = sampling.static_guidance(guidance)
    skip = None if skip is None else tuple(bool(s) for s in skip)
    noise = noise.astype(jnp.float32)
    if on_step is None:
        run = _compiled(graphdef, plan, scale, skip)
        return jax.block_until_ready(run(state, noise, cond, negative, key, resume))
    programs = _StagePrograms.of(graphdef, plan, scale, skip)
    return programs.run(state, noise, cond, negative, key, resume, on_step)


@functools.lru_cache(maxsize=32)
def _compiled(graphdef, plan: Plan, guidance, skip=None):
    # Cached on static values only: nothing per call goes into the key.
    @jax.jit
    def run(state, noise, cond, negative, key, resume):
        model = nnx.merge(graphdef, state)
        velocity = model_velocity(model, cond, negative, guidance)
        return sample(velocity, noise, plan, key=key, resume=resume, skip=skip)

    return run


@dataclasses.dataclass(frozen=True)
class _StagePrograms:
    """`sample` driven from the host, one compiled step per call, reporting each finished step:
    a program with a host callback inside never goes to jax's persistent cache, so with one
    every process (each `vidax generate --accel dvg` with its progress bar) compiled the stages
    again. Each stage's step, its last step with the transition into the next stage, and the
    entry are programs of their own (cached on the static values, like `_compiled`)."""

    graphdef: Any
    plan: Plan
    guidance: Any
    skip: tuple[bool, ...] | None

    @staticmethod
    @functools.lru_cache(maxsize=32)
    def of(graphdef, plan: Plan, guidance, skip) -> _StagePrograms:
        return _StagePrograms(graphdef, plan, guidance, skip)

    def velocity(self, index: int, state, cond, negative):
        model = nnx.merge(self.graphdef, state)
        velocity = model_velocity(model, cond, negative, self.guidance)
        return stage_velocity(velocity, self.plan, self.plan.stages[index])

    def reuse_at(self, index: int) -> np.ndarray | None:
        """Stage `index`'s forecast steps (`step_cache.reuse_mask`), None if it has none."""
        solver = self.plan.stages[index].solver
        local = _stage_skip(self.plan, index, self.skip)
        if local is None or not any(local):
            return None
        return sampling.step_cache.reuse_mask(local, 0, solver.num_steps)

    @functools.cached_property
    def enter(self):
        """Stage 0's starting latent from the full-resolution noise."""
        first, methods = self.plan.stages[0], _methods(self.plan)
        if first.factors == (1, 1):
            return lambda noise: noise
        return jax.jit(lambda noise: restrict_noise(noise, first.factors, **methods))

    @functools.cached_property
    def init(self):
        """Stage `index`'s solver state and (with forecast steps) the step cache's memory."""

        def init(index, x):
            solver = self.plan.stages[index].solver
            memory = None
            if self.reuse_at(index) is not None:
                memory = sampling.step_cache.init_memory(x, solver.num_steps)
            return solver.init(x), memory

        return jax.jit(init, static_argnums=0)

    @functools.cached_property
    def step(self):
        def step(index, state, cond, negative, x, solver_state, memory, i):
            velocity = self.velocity(index, state, cond, negative)
            solver = self.plan.stages[index].solver
            return sampling.carried_step(
                velocity, x, solver_state, memory, solver, self.reuse_at(index), i
            )

        return jax.jit(step, static_argnums=0)

    @functools.cached_property
    def leave(self):
        """A reduced stage's last step and the transition into the next stage."""

        def leave(index, state, cond, negative, x, noise, key):
            velocity = self.velocity(index, state, cond, negative)
            x0, eps_hat = _last_step(velocity, x, self.plan.stages[index].solver)
            return transition(x0, eps_hat, noise, self.plan, index + 1, key=key)

        return jax.jit(leave, static_argnums=0)

    @functools.cached_property
    def resume(self):
        return jax.jit(
            lambda p, noise, key: transition(p.x0, p.eps_hat, noise, self.plan, 1, key=key)
        )

    def run(self, state, noise, cond, negative, key, resume, on_step) -> jax.Array:
        """As `sample` (same arguments), `on_step` called after each finished step."""
        stages = self.plan.stages
        if resume is None:
            x, start = self.enter(noise), 0
        else:
            _check_resume(resume, self.plan)
            (x, noise), start = self.resume(resume, noise, key), 1
        for index in range(start, len(stages)):
            stage, last = stages[index], index == len(stages) - 1
            n = stage.solver.num_steps
            solver_state, memory = self.init(index, x)
            for i in range(n if last else n - 1):
                x, solver_state, memory = jax.block_until_ready(
                    self.step(index, state, cond, negative, x, solver_state, memory, i)
                )
                on_step(stage.start + i)
            if not last:
                x, noise = jax.block_until_ready(
                    self.leave(index, state, cond, negative, x, noise, key)
                )
                on_step(stage.start + n - 1)
        return x


def probe(
    model: PatchedDiT,
    noise: jax.Array,
    cond,
    negative,
    *,
    plan: Plan,
    guidance: float,
) -> Probe:
    """Runs stage 0 of `plan` (the selector's probe) and measures its clean prediction.

    Args:
      model / noise / cond / negative / guidance: as `denoise`.
      plan: a reduced plan; only its first stage runs (e.g. `probe_stage`'s, followed by the
        full-resolution rest).

    Returns:
      A `Probe` for `vidax.dvg.select` (its `signals` and `stage`) and `denoise(resume=...)`.
    """
    if plan.stages[0].factors == (1, 1):
        raise ValueError(f"the probe needs a reduced first stage, got {plan.schedule.describe()}")
    graphdef, state = nnx.split(model)
    use_cfg = negative is not None and guidance != 1.0
    run = _compiled_probe(graphdef, plan, sampling.static_guidance(guidance), use_cfg)
    return run(state, noise.astype(jnp.float32), cond, negative if use_cfg else None)


@functools.lru_cache(maxsize=16)
def _compiled_probe(graphdef, plan: Plan, guidance: float, use_cfg: bool):
    @jax.jit
    def run(state, noise, cond, negative):
        model = nnx.merge(graphdef, state)
        velocity = model_velocity(model, cond, negative, guidance)
        first = plan.stages[0]
        x = restrict_noise(noise, first.factors, **_methods(plan))
        x0, eps_hat = run_stage(velocity, x, plan, 0)
        return Probe(x0, eps_hat, measure(x0), plan.schedule.stages[0])

    return run


def probe_stage(
    latent: tuple[int, int, int], patch: tuple[int, int, int], num_steps: int, policy=None
) -> Stage | None:
    """The selector's probe: the first `policy.probe_steps(num_steps)` steps on the coarsest
    candidate grid that still shows motion and detail, or None when no axis can be reduced.

    "Still shows" means at least `_PROBE_MIN_FRAMES` frames (a temporal difference needs two,
    an interpolation residual three) and `_PROBE_MIN_SIZE` latent pixels across (a half-band
    of a few frequencies).
    """
    policy = policy or DEFAULT_POLICY
    grids = [ladder[0] for family in ladders(latent, patch, policy).values() for ladder in family]
    grids = [
        f
        for f in grids
        if f != (1, 1)
        and reduced_shape(latent, f)[0] >= min(latent[0], _PROBE_MIN_FRAMES)
        and min(reduced_shape(latent, f)[1:]) >= min(*latent[1:], _PROBE_MIN_SIZE)
    ]
    if not grids or num_steps < 2:
        return None
    ft, fs = max(grids, key=lambda f: (f[0] * f[1] * f[1], f))
    return Stage(ft, fs, policy.probe_steps(num_steps))


_PROBE_MIN_FRAMES = 3
_PROBE_MIN_SIZE = 8


# -- accel modes: none / spatial / temporal / joint / dvg -----------------------------------------

ACCEL_MODES = ("none", "spatial", "temporal", "joint", "dvg")
DEFAULT_BUDGET = 0.2


def accelerate(
    model: PatchedDiT,
    noise: jax.Array,
    cond,
    negative,
    *,
    solver,
    guidance: float,
    accel: str = "dvg",
    budget: float = DEFAULT_BUDGET,
    policy=None,
    key: jax.Array | None = None,
    on_step: Callable[[int], None] | None = None,
    skip: Sequence[bool] | None = None,
    **options,
) -> tuple[jax.Array, list]:
    """Denoises with a reduced-grid schedule picked per video; returns (latents, choices).

    Args:
      model: a DiT with a `config` (patch size, FLOP model) accepting `positions`.
      noise: (b, t, h, w, c) starting noise.
      cond / negative / guidance: as `vidax.pipeline.denoise` (a `condition` in them is
        restricted to each stage's grid).
      solver: the base solver (its steps and shift define the full-resolution run).
      accel: "dvg" (probe + content-aware selector), "spatial" / "temporal" / "joint" (the best
        schedule of that family for the budget, independent of content), or "none" (the base
        sampler, exactly).
      budget: compute to spend, as a fraction of the full sampler's token-steps (sum of steps x
        grid size), in (0, 1]; the probe counts against it unless the schedule resumes from it.
        Below the cheapest schedule (few steps: one full-resolution step of 4 is 0.25), the
        cheapest one runs, with a warning.
        FLOPs fall further than the budget on large grids (attention is quadratic), wall-clock
        less on tiny ones (fixed costs).
      policy: `vidax.dvg.Policy` (default: `DEFAULT_POLICY`). `vidax.pipeline.generate` passes
        the preset's (`Policy(spatial=spec.dvg_spatial)`). An explicit "spatial" or "joint"
        under `spatial=False` runs with a warning.
      key: PRNG key for `noise="fresh"` plans.
      on_step: host callback per step (base-schedule step index).
      skip: (base steps,) steps whose model forward reuses the previous step's output in every
        stage (`vidax.sampling.step_cache`; the probe computes every step).
      **options: `plan` options (temporal, spatial, rope, noise).

    Returns:
      (latents (b, t, h, w, c) float32, one `vidax.dvg.Choice` per video).
    """
    if accel not in ACCEL_MODES:
        raise ValueError(f"accel must be one of {ACCEL_MODES}, got {accel!r}")
    if not 0 < budget <= 1:
        raise ValueError(f"budget must be in (0, 1], got {budget}")
    policy = policy or selector.DEFAULT_POLICY
    if accel in ("spatial", "joint") and not policy.spatial:
        warnings.warn(
            f"accel={accel!r} reduces space, which this policy rules out (Policy.spatial=False: "
            "the model was trained at one resolution and its spatial stages degrade the video); "
            "running it as asked",
            stacklevel=2,
        )
        policy = dataclasses.replace(policy, spatial=True)
    config = model.config
    t, h, w = noise.shape[1:4]
    latent = (t, h, w)
    n = solver.num_steps
    batch = noise.shape[0]
    pt, ph, pw = config.patch_size
    patch = (pt, ph, pw)
    make_plan = functools.partial(
        _cached_plan,
        latent=latent,
        patch=patch,
        solver=solver,
        multiple=_mesh_multiple(),
        **options,
    )
    run = functools.partial(denoise, model, guidance=guidance, key=key, skip=skip)

    if accel == "none" or budget >= 1:
        full = Schedule.full(n)
        latents = run(noise, cond, negative, plan=make_plan(full), on_step=on_step)
        return latents, [selector.Choice("none", full, 1.0, 0.0, None)] * batch

    reducing = tuple(
        f for f in selector.FAMILIES if f != "none" and (policy.spatial or f == "temporal")
    )

    def affordable(families, probe_at):
        """The budget, or (with a warning) the cheapest schedule's cost when none fits it."""
        kw: dict[str, Any] = dict(policy=policy, families=families, probe=probe_at)
        if selector.select(latent, patch, solver.sigmas, budget, None, **kw) is not None:
            return budget
        cheapest = selector.cheapest(latent, patch, solver.sigmas, **kw)
        if cheapest is None:
            raise ValueError(
                f"no {'/'.join(families)} schedule of {n} steps exists for latent {latent} "
                f"(no factor divides it); use accel='none'"
            )
        warnings.warn(
            f"budget {budget:.3g} is below the cheapest {'/'.join(families)} schedule of {n} "
            f"steps for latent {latent}; running at its cost {cheapest:.3g}",
            stacklevel=3,
        )
        return cheapest

    first = probe_stage(latent, patch, n, policy) if accel == "dvg" else None
    if first is not None and selector.settled(
        latent, patch, solver.sigmas, budget, policy=policy, families=reducing
    ):
        # one schedule wins for any content (e.g. the only one the budget affords): measuring
        # the video would change nothing, so its probe steps are not spent
        first = None
    if first is None:
        families = reducing if accel == "dvg" else (accel,)
        fitted = affordable(families, None)
        choice = selector.select(
            latent, patch, solver.sigmas, fitted, None, policy=policy, families=families
        )
        assert choice is not None  # `affordable` fitted the budget to a candidate
        latents = run(noise, cond, negative, plan=make_plan(choice.schedule), on_step=on_step)
        return latents, [choice] * batch

    budget = affordable(reducing, first)
    probe_plan = make_plan(Schedule((first, Stage(1, 1, n - first.steps))))
    probed = probe(model, noise, cond, negative, plan=probe_plan, guidance=guidance)
    choices = []
    for row in np.asarray(probed.signals):
        measured = (float(row[0]), float(row[1]))
        choice = selector.select(
            latent, patch, solver.sigmas, budget, measured, policy=policy, probe=first
        )
        # `affordable` fitted the budget to a candidate; the signals only rank candidates.
        assert choice is not None
        choices.append(choice)
    groups: dict[Schedule, list[int]] = {}
    for i, c in enumerate(choices):
        groups.setdefault(c.schedule, []).append(i)
    parts = {}
    for g, (schedule, rows) in enumerate(groups.items()):
        idx = np.asarray(rows)
        parts[schedule] = run(
            noise[idx],
            _take(idx, cond),
            None if negative is None else _take(idx, negative),
            plan=make_plan(schedule),
            # the probe is this schedule's first stage: continue from it
            resume=probed.take(idx) if probed.resumes(schedule) else None,
            # one bar over the steps for all the groups, each running its own schedule
            on_step=progress.share(on_step, n, g, len(groups)),
        )
    if len(groups) == 1:
        return parts[choices[0].schedule], choices
    order = np.argsort(np.concatenate([np.asarray(rows) for rows in groups.values()]))
    return jnp.concatenate(list(parts.values()), axis=0)[order], choices


@functools.lru_cache(maxsize=128)
def _cached_plan(schedule, **kwargs):
    return plan_schedule(schedule, **kwargs)


def _take(idx, tree):
    return jax.tree.map(lambda a: a[idx], tree)


def _mesh_multiple() -> int:
    """Token-count multiple for the active mesh's sequence-parallel axis (1 without a mesh)."""
    active = current()
    if active is None:
        return 1
    mesh, _ = active
    return int(mesh.shape.get("seq", 1))
