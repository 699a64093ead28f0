"""`--accel` / `--budget` for the `vidax generate` command.

`vidax.cli` adds them to its `generate` signature and forwards `generate_kwargs(...)` to
`vidax.pipeline.generate`:

    accel: AccelOption = "none",
    budget: BudgetOption = None,
    ...
    pipeline.generate(spec, ..., **dvg_command.generate_kwargs(accel, budget))
"""

from __future__ import annotations

from typing import Annotated

import typer

from vidax.dvg.sampler import DEFAULT_BUDGET

CLI_MODES = ("dvg", "spatial", "temporal", "joint", "cache", "dvg+cache", "none")

AccelOption = Annotated[
    str,
    typer.Option(
        "--accel",
        help=(
            "Progressive sampling: dvg (a probe picks time/space reduction per video), "
            "spatial | temporal | joint (fixed reduction); cache (skip the model forwards "
            "whose output barely changes, calibrated by a first full run); dvg+cache (both); "
            "none (full resolution, every step)."
        ),
    ),
]
BudgetOption = Annotated[
    float | None,
    typer.Option(
        "--budget",
        help=(
            "Speed/quality preference for --accel: the fraction of full-sampling compute to "
            "spend, in (0, 1] (DVG default 0.2: ~5x fewer token-steps; cache: the fraction of "
            "model forwards to run, default 0.6; 1 = no reduction). Needs --accel."
        ),
    ),
]

__all__ = ["CLI_MODES", "DEFAULT_BUDGET", "AccelOption", "BudgetOption", "generate_kwargs"]


def generate_kwargs(accel: str, budget: float | None) -> dict:
    """Validated `accel`/`budget` keyword arguments for `vidax.pipeline.generate`.

    `budget` None means the default (`DEFAULT_BUDGET`). Raises ValueError (a one-line CLI error)
    on an unknown mode, a budget outside (0, 1], or a budget without an accelerated mode.
    """
    if accel not in CLI_MODES:
        raise ValueError(f"--accel must be one of {', '.join(CLI_MODES)}, got {accel!r}")
    if budget is None:  # `vidax.pipeline.generate` picks the mode's default
        return {"accel": accel, "budget": None}
    if not 0 < budget <= 1:
        raise ValueError(f"--budget must be in (0, 1], got {budget}")
    if accel == "none":
        raise ValueError(
            f"--budget {budget} needs --accel ({', '.join(CLI_MODES[:-1])}): without it every "
            "step runs at full resolution"
        )
    return {"accel": accel, "budget": budget}
