"""Stage schedules and their resolution onto a latent: grids, noise levels and solvers.

A `Schedule` is a list of `Stage(t_factor, s_factor, steps)` from coarse to fine that ends at
full resolution, e.g. `Schedule.of([(2, 2, 8), (1, 2, 4), (1, 1, 8)])`. `plan(schedule, ...)`
resolves it for one latent shape and base solver into a hashable `Plan` (one jit per plan).

**Grids.** A temporal factor f keeps the nested frames {0, f, 2f, ..., t-1}, so (t - 1) must be
divisible by f (Wan-style latents have 1 + 4k frames: 21 -> 11 -> 6). A spatial factor f keeps
h/f x w/f low-passed samples, so h and w must be divisible by f (`vidax.dvg.transition`). A
reduced grid whose size is not a multiple of the patch (or whose token count is not a multiple
of the mesh's sequence axis) is padded at the end and cropped after each model call.
Consecutive stages must nest: each factor divides the previous stage's.

**Noise levels: resolution-dependent shift.** Low-passing k = f^2 pixels of a frame of
x_sigma = (1 - sigma) x0 + sigma eps keeps a smooth x0 and divides the noise std by sqrt(k):

    low(x_sigma) = (1 - sigma) x0_lo + (sigma / sqrt(k)) eps_lo,

which, rescaled to the flow form, sits at sigma_lo = sigma / (sqrt(k) (1 - sigma) + sigma) =
shift(sigma, 1 / sqrt(k)). So a grid with r = tokens per frame / full tokens per frame reaches
the same signal-to-noise at the noise level shifted by sqrt(r); shifts compose multiplicatively
(shift(shift(s, a), b) = shift(s, ab)), so a stage that runs steps [a, b) of the base schedule
uses sigma_i^stage = shift(sigma_i^base, sqrt(r)): the base schedule's shift times sqrt(r), as
SD3's resolution-dependent shifting (shift sqrt(m / n) for m vs n pixels) and Wan's 3 at 480p /
5 at 720p. Dropping frames does not average anything (the kept frames keep their SNR), so the
temporal factor does not enter the shift. All stages share the base schedule's time grid u_i;
only the shift differs, so a finer grid re-enters at a higher sigma than the coarse one left.

**Stage solver.** A reduced stage runs the base schedule's steps [a, b) with its own solver over
[sigma_a, ..., sigma_{b-1}, 0]; its last model evaluation gives the clean prediction
x0 = x - sigma_{b-1} v and the noise prediction x + (1 - sigma_{b-1}) v, which the transition
carries to the next grid (`vidax.dvg.transition`). The last stage runs the base schedule's tail
[sigma_a, ..., 0]; a single full stage is the base solver itself, so `Schedule.full(n)` is the
base sampler exactly.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from vidax.dvg.transition import SPATIAL_METHODS, TEMPORAL_METHODS
from vidax.sampling import FlowEuler, Solver, UniPC, shift_sigmas


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: `steps` model evaluations on a grid reduced by (t_factor, s_factor)."""

    t_factor: int
    s_factor: int
    steps: int

    def __post_init__(self):
        for name in ("t_factor", "s_factor", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"Stage.{name} must be an int, got {value!r}")
        if self.t_factor < 1 or self.s_factor < 1:
            raise ValueError(f"stage factors must be >= 1, got {self.factors}")
        if self.steps < 1:
            raise ValueError(f"a stage needs at least one step, got steps={self.steps}")

    @property
    def factors(self) -> tuple[int, int]:
        return (int(self.t_factor), int(self.s_factor))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Stages from coarse to fine, ending at full resolution (factors (1, 1))."""

    stages: tuple[Stage, ...]

    def __post_init__(self):
        stages = tuple(s if isinstance(s, Stage) else Stage(*s) for s in self.stages)
        object.__setattr__(self, "stages", stages)
        if not stages:
            raise ValueError("a schedule needs at least one stage")
        if stages[-1].factors != (1, 1):
            raise ValueError(
                f"the last stage must be full resolution (factors (1, 1)), got {stages[-1].factors}"
            )
        for prev, nxt in itertools.pairwise(stages):
            if prev.factors == nxt.factors:
                raise ValueError(f"consecutive stages share the grid {prev.factors}; merge them")
            for axis, a, b in zip(("t_factor", "s_factor"), prev.factors, nxt.factors, strict=True):
                if a % b:
                    raise ValueError(
                        f"stages must refine a nested grid: {axis} {b} does not divide the "
                        f"previous stage's {a} (schedule {self.describe()})"
                    )

    @classmethod
    def of(cls, stages: Iterable[Stage | Sequence[int]]) -> Schedule:
        """A schedule from `Stage`s or (t_factor, s_factor, steps) triples."""
        return cls(tuple(s if isinstance(s, Stage) else Stage(*s) for s in stages))

    @classmethod
    def full(cls, steps: int) -> Schedule:
        """No reduction: the base sampler."""
        return cls((Stage(1, 1, steps),))

    @property
    def num_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def is_full(self) -> bool:
        return len(self.stages) == 1

    def describe(self) -> str:
        return " -> ".join(f"t/{s.t_factor} s/{s.s_factor} x{s.steps}" for s in self.stages)


def _triple(values: Iterable[int]) -> tuple[int, int, int]:
    """(a, b, c) as Python ints (a ValueError unless there are exactly three)."""
    a, b, c = (int(v) for v in values)
    return a, b, c


def reduced_shape(latent: tuple[int, int, int], factors: tuple[int, int]) -> tuple[int, int, int]:
    """(t', h', w') of a latent (t, h, w) on the grid reduced by (t_factor, s_factor).

    Raises ValueError when a factor does not divide the latent (see the module docstring).
    """
    t, h, w = latent
    ft, fs = factors
    if (t - 1) % ft:
        raise ValueError(
            f"temporal factor {ft} does not divide the {t}-frame latent: the nested frames "
            f"0, {ft}, 2*{ft}, ... must end on frame {t - 1} (need (t - 1) % factor == 0)"
        )
    if h % fs or w % fs:
        raise ValueError(f"spatial factor {fs} does not divide the latent {h}x{w}")
    return (t - 1) // ft + 1, h // fs, w // fs


def _padding(
    shape: tuple[int, int, int], patch: tuple[int, int, int], multiple: int
) -> tuple[int, int, int]:
    """Latent padding (end of each axis) making the shape patch-divisible and its token count a
    multiple of `multiple`, preferring the fewest extra tokens and spatial over temporal pads."""
    base = [-(-n // p) * p for n, p in zip(shape, patch, strict=True)]
    best = None
    for dt in range(multiple):
        for dh in range(multiple):
            for dw in range(multiple):
                grid = [b // p + d for b, p, d in zip(base, patch, (dt, dh, dw), strict=True)]
                tokens = math.prod(grid)
                if tokens % multiple:
                    continue
                key = (tokens, dt, dh + dw)
                if best is None or key < best[0]:
                    best = (key, grid)
    if best is None:  # unreachable: padding every axis by `multiple - ...` always works
        raise ValueError(f"cannot pad {shape} to a multiple of {multiple} tokens")
    grid = best[1]
    return _triple(g * p - n for g, p, n in zip(grid, patch, shape, strict=True))


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One resolved stage.

    Attributes:
      factors: (t_factor, s_factor).
      shape: (t', h', w') latent grid of the stage.
      pad: (t, h, w) latent padding appended before each model call (cropped after).
      start / stop: the base schedule's steps [start, stop) this stage runs.
      shift: the multiplicative shift sqrt(h' w' / (h w)) applied to the base sigmas.
      solver: the stage's solver (sigmas end at 0; see the module docstring).
    """

    factors: tuple[int, int]
    shape: tuple[int, int, int]
    pad: tuple[int, int, int]
    start: int
    stop: int
    shift: float
    solver: Solver

    @property
    def padded(self) -> tuple[int, int, int]:
        return _triple(n + p for n, p in zip(self.shape, self.pad, strict=True))

    @property
    def entry_sigma(self) -> float:
        """The noise level the stage starts at (the re-noise level of a transition into it)."""
        return float(self.solver.sigmas[0])


@dataclasses.dataclass(frozen=True)
class Plan:
    """A schedule resolved for one latent (hashable: the key of the compiled loop).

    Attributes:
      schedule: the `Schedule`.
      latent: full (t, h, w).
      patch: the DiT's patch (pt, ph, pw).
      stages: one `StagePlan` per stage.
      temporal / spatial: upsampling methods of the transitions (`vidax.dvg.transition`).
      rope: "scaled" (reduced grids on full-resolution RoPE coordinates) or "compact".
      noise: re-noising at transitions (`vidax.dvg.transition`): "consistent" (the coarse
        stage's predicted noise on its subspace, the starting noise elsewhere), "initial" (the
        starting noise) or "fresh" (new draws).
    """

    schedule: Schedule
    latent: tuple[int, int, int]
    patch: tuple[int, int, int]
    stages: tuple[StagePlan, ...]
    temporal: str = "linear"
    spatial: str = "dct"
    rope: str = "scaled"
    noise: str = "consistent"

    @property
    def is_full(self) -> bool:
        return self.schedule.is_full


NOISE_MODES = ("consistent", "initial", "fresh")


def plan(
    schedule: Schedule,
    latent: tuple[int, int, int],
    patch: tuple[int, int, int],
    solver: Solver,
    *,
    multiple: int = 1,
    temporal: str = "linear",
    spatial: str = "dct",
    rope: str = "scaled",
    noise: str = "consistent",
) -> Plan:
    """Resolves `schedule` for a latent (t, h, w) and a base solver.

    Args:
      schedule: the stages; their steps must add up to `solver.num_steps`.
      latent: full latent (t, h, w).
      patch: the DiT's patch size (pt, ph, pw).
      solver: the base `vidax.sampling` solver (FlowEuler or UniPC) of the full-resolution run.
      multiple: reduced stages' token counts are padded to a multiple of this (the mesh's
        sequence-parallel size on the sharded path).
      temporal / spatial: grid operator methods (`vidax.dvg.transition`).
      rope: "scaled" or "compact" RoPE positions on reduced grids.
      noise: "consistent", "initial" or "fresh" (see `Plan`).

    Returns:
      The `Plan`; raises ValueError on a schedule that does not fit.
    """
    if schedule.num_steps != solver.num_steps:
        raise ValueError(
            f"the schedule has {schedule.num_steps} steps but the solver {solver.num_steps}"
        )
    if temporal not in TEMPORAL_METHODS:
        raise ValueError(f"temporal upsampling must be one of {TEMPORAL_METHODS}, got {temporal!r}")
    if spatial not in SPATIAL_METHODS:
        raise ValueError(f"spatial upsampling must be one of {SPATIAL_METHODS}, got {spatial!r}")
    if rope not in ("scaled", "compact"):
        raise ValueError(f"rope must be 'scaled' or 'compact', got {rope!r}")
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    latent = _triple(latent)
    patch = _triple(patch)
    if any(n % p for n, p in zip(latent, patch, strict=True)):
        raise ValueError(f"latent {latent} is not divisible by the patch {patch}")
    if patch[0] != 1 and any(s.t_factor > 1 for s in schedule.stages):
        raise ValueError(f"temporal reduction needs a temporal patch of 1, got {patch}")
    base = np.asarray(solver.sigmas, np.float64)
    stages, start = [], 0
    for i, stage in enumerate(schedule.stages):
        shape = reduced_shape(latent, stage.factors)
        stop = start + stage.steps
        last = i == len(schedule.stages) - 1
        if schedule.is_full:
            stage_solver, shift, pad = solver, 1.0, (0, 0, 0)
        elif last:
            stage_solver, shift, pad = _solver_like(solver, base[start:]), 1.0, (0, 0, 0)
        else:
            shift = math.sqrt(shape[1] * shape[2] / (latent[1] * latent[2]))
            # (clipped: shifting sigma = 1 may round a hair above 1)
            sigmas = np.append(np.minimum(shift_sigmas(base[start:stop], shift), 1.0), 0.0)
            stage_solver = _solver_like(solver, sigmas)
            pad = _padding(shape, patch, multiple)
        stages.append(
            StagePlan(
                factors=stage.factors,
                shape=shape,
                pad=pad,
                start=start,
                stop=stop,
                shift=shift,
                solver=stage_solver,
            )
        )
        start = stop
    return Plan(
        schedule=schedule,
        latent=latent,
        patch=patch,
        stages=tuple(stages),
        temporal=temporal,
        spatial=spatial,
        rope=rope,
        noise=noise,
    )


def _solver_like(solver: Solver, sigmas: np.ndarray) -> Solver:
    """A solver of the base solver's kind and options over explicit sigmas."""
    if isinstance(solver, UniPC):
        return UniPC.from_sigmas(
            sigmas,
            order=solver.order,
            solver_type=solver.solver_type,
            lower_order_final=solver.lower_order_final,
        )
    if isinstance(solver, FlowEuler):
        return FlowEuler.from_sigmas(sigmas)
    raise ValueError(f"DVG supports FlowEuler and UniPC base solvers, got {type(solver).__name__}")
