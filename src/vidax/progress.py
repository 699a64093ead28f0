"""The one progress bar of vidax's long work (denoising steps, training steps)."""

from __future__ import annotations

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
