"""Flow-matching solvers and the jitted denoising loop.

- `FlowEuler`, `UniPC`: pure-functional solvers (diffusers parity) with `sigmas`, `timesteps`,
  `init(x)` and `step(state, i, x, v)`; `make_solver(name, num_steps, shift)` builds one by name.
- `sample` / `sample_steps`: the `lax.fori_loop` over solver steps.
- `step_cache`: skip forwards whose output barely changes (`plan_skips`, `cached_steps`).
- `classifier_free_guidance`: one batched forward for the guided velocity (`cfg_combine`:
  the guidance formula itself); `ExpertGuidance`: a scale per expert of a two-expert model.
- `shift_sigmas`, `predict_x0`, `renoise`: rectified-flow algebra.
"""

from vidax.sampling import step_cache
from vidax.sampling.loop import (
    ExpertGuidance,
    carried_step,
    cfg_combine,
    classifier_free_guidance,
    predict_x0,
    renoise,
    sample,
    sample_steps,
    solver_step,
    static_guidance,
)
from vidax.sampling.schedulers import (
    SOLVERS,
    FlowEuler,
    Solver,
    UniPC,
    UniPCState,
    make_solver,
    shift_sigmas,
)

__all__ = [
    "SOLVERS",
    "ExpertGuidance",
    "FlowEuler",
    "Solver",
    "UniPC",
    "UniPCState",
    "carried_step",
    "cfg_combine",
    "classifier_free_guidance",
    "make_solver",
    "predict_x0",
    "renoise",
    "sample",
    "sample_steps",
    "shift_sigmas",
    "solver_step",
    "static_guidance",
    "step_cache",
]
