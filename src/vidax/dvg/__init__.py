"""DVG: dynamic spatio-temporal progressive sampling with a content-aware selector.

Early denoising steps run on a latent reduced in time and/or space; a probe of the first steps
picks, per video, how to split the compute between the axes under a FLOP budget. Training-free;
works with every vidax DiT whose forward accepts `positions` (Wan, HunyuanVideo).

- `Stage`, `Schedule`: `[(t_factor, s_factor, steps), ...]` ending at full resolution;
  `plan(schedule, latent, patch, solver)` resolves grids, noise levels and stage solvers.
- `sample` (inside jit) / `denoise` (a DiT, one compile per plan): the multi-stage loop.
- `probe_stage`, `probe` -> `Probe`: the selector's cheap first stage, resumable by any
  schedule that starts with it (`denoise(..., resume=probe)`).
- `restrict_noise`, `upsample`, `correct_noise`, `renoise`, `positions`: the transition math
  (per-axis grid operators `axis_operators`).
- `measure`, `candidates`, `choose` / `select` (cached), `Policy`: the selector; `accelerate`
  runs an accel mode ("dvg", "spatial", "temporal", "joint", "none") end to end.
- `step_flops`, `relative_cost`: the analytic FLOP model used for budgets.
"""

from vidax.dvg.cost import relative_cost, schedule_flops, step_flops
from vidax.dvg.sampler import (
    ACCEL_MODES,
    DEFAULT_BUDGET,
    Probe,
    StageGrid,
    accelerate,
    denoise,
    probe,
    probe_stage,
    sample,
)
from vidax.dvg.schedule import Plan, Schedule, Stage, StagePlan, plan, reduced_shape
from vidax.dvg.selector import (
    DEFAULT_POLICY,
    FAMILIES,
    Candidate,
    Choice,
    Policy,
    candidates,
    choose,
    ladders,
    measure,
    select,
)
from vidax.dvg.transition import (
    SPATIAL_METHODS,
    TEMPORAL_METHODS,
    axis_operators,
    correct_noise,
    downsample,
    positions,
    renoise,
    restrict_noise,
    upsample,
)

__all__ = [
    "ACCEL_MODES",
    "DEFAULT_BUDGET",
    "DEFAULT_POLICY",
    "FAMILIES",
    "SPATIAL_METHODS",
    "TEMPORAL_METHODS",
    "Candidate",
    "Choice",
    "Plan",
    "Policy",
    "Probe",
    "Schedule",
    "Stage",
    "StageGrid",
    "StagePlan",
    "accelerate",
    "axis_operators",
    "candidates",
    "choose",
    "correct_noise",
    "denoise",
    "downsample",
    "ladders",
    "measure",
    "plan",
    "positions",
    "probe",
    "probe_stage",
    "reduced_shape",
    "relative_cost",
    "renoise",
    "restrict_noise",
    "sample",
    "schedule_flops",
    "select",
    "step_flops",
    "upsample",
]
