"""The one progress bar of vidax's long work (denoising steps, training steps), and the step
reporting of runs made of several passes."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def step_bar(console: Console, *fields: ProgressColumn | str, disable: bool = False) -> Progress:
    """description | bar | done/total | `fields` (columns, or format strings over the task
    such as "loss {task.fields[loss]:.4f}") | elapsed | remaining, on `console`."""
    extra = [TextColumn(f) if isinstance(f, str) else f for f in fields]
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=disable,
    )


def share(
    on_step: Callable[[int], None] | None, steps: int, part: int, parts: int
) -> Callable[[int], None] | None:
    """`on_step` for pass `part` of `parts` runs of `steps` steps reported as one run of `steps`.

    Pass k's step i reports step floor((k * steps + i + 1) / parts) - 1 (nothing while that
    is -1), so a bar over `steps` advances monotonically through every pass and completes at
    the last step of the last pass, not before (e.g. a step-cache calibration run before DVG's,
    or DVG's schedules for a batch whose videos chose different ones).
    """
    if on_step is None or parts == 1:
        return on_step
    if not 0 <= part < parts:
        raise ValueError(f"part must be in [0, {parts}), got {part}")

    def report(i: int) -> None:
        done = (part * steps + int(i) + 1) // parts
        if done:
            on_step(done - 1)

    return report
