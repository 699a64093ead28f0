"""`vidax plan` and `load_plan`: from a search to a mesh the pipeline runs on.

    register(app)                        # adds `vidax plan` to a typer app
    mesh, strategy = load_plan("plan.json")
    vidax.pipeline.generate(..., mesh=mesh, strategy=strategy)

How a plan maps onto the devices of the running process (`load_plan`):

1. On the slice it was planned for (TPU devices whose coordinates are exactly the plan's chips,
   and as many devices as the mesh needs), logical device i runs on the chip at
   `plan.coords[i]`: the searched placement.
2. Anywhere else (CPU devices, a GPU, another slice) the placement means nothing, so the mesh
   keeps only the plan's logical shape and axis names: logical device i (row-major over
   `plan.mesh_shape`) is `jax.devices()[i]`, i.e. devices in id order (process-major when
   several processes share the mesh). The first `prod(mesh_shape)` devices are used; fewer is
   an error. Results are identical either way, only speed differs.

The search, the presets and the sharding rules are imported inside the functions: `vidax`
imports this module at start-up for every command.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer

from vidax.planner.search import ShardingPlan

# Compiled candidates are kept here between runs (`vidax plan --no-cache` to bypass).
DEFAULT_CACHE = Path(os.environ.get("VIDAX_CACHE", Path.home() / ".cache" / "vidax")) / "planner"


def load_plan(path: str | Path, devices=None):
    """Reads `path` and realises its mesh over this process's devices (module doc, rules 1-2).

    Args:
        path: a plan file written by `vidax plan`.
        devices: the devices to use (default `jax.devices()`, all processes' devices).

    Returns:
        (jax.sharding.Mesh with Auto axes, vidax.sharding.Strategy).

    Raises:
        ValueError: for a malformed plan, an unknown strategy, or too few devices.
        FileNotFoundError: if the file is missing.
    """
    plan = ShardingPlan.load(path)
    return realize_plan(plan, devices)


def realize_plan(plan: ShardingPlan, devices=None):
    """`load_plan` for an in-memory `ShardingPlan`."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from vidax.sharding.rules import auto_mesh, get_strategy

    strategy = get_strategy(plan.strategy)
    devices = list(jax.devices() if devices is None else devices)
    n = math.prod(plan.mesh_shape)
    if len(devices) < n:
        raise ValueError(
            f"plan for {plan.topology} needs a mesh of {n} devices {plan.mesh_shape}, but only "
            f"{len(devices)} are available"
        )
    by_coords = _planned_slice(plan, devices)
    chosen = devices[:n] if by_coords is None else [by_coords[tuple(c)] for c in plan.coords]
    grid = np.asarray(chosen, dtype=object).reshape(plan.mesh_shape)
    return auto_mesh(Mesh(grid, tuple(plan.axis_names))), strategy


def _planned_slice(plan: ShardingPlan, devices) -> dict | None:
    """{coords: device} if `devices` are exactly the planned slice's chips, else None."""
    if len(devices) != len(plan.coords) or any(d.platform != "tpu" for d in devices):
        return None
    ndim = len(plan.coords[0])
    try:
        table = {tuple(int(c) for c in d.coords[:ndim]): d for d in devices}
    except (AttributeError, TypeError):
        return None
    if set(table) != {tuple(c) for c in plan.coords}:
        return None
    return table


def _parse_size(size: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size must be HEIGHTxWIDTH, e.g. 480x832; got {size!r}") from None
    return height, width


def register(app: typer.Typer) -> None:
    """Adds the `plan` command to `app`."""

    @app.command("plan")
    def plan_command(
        topology: Annotated[str, typer.Option(help="TPU slice, e.g. v5e:4x4, v5e:2x4, v6e:4x4.")],
        model: Annotated[str, typer.Option(help="Model preset (a Wan DiT).")] = "wan2.1-1.3b",
        frames: Annotated[
            int | None, typer.Option(help="Video frames (default: the preset's).")
        ] = None,
        size: Annotated[
            str | None, typer.Option(help="HEIGHTxWIDTH in pixels, e.g. 480x832.")
        ] = None,
        cfg: Annotated[
            bool, typer.Option(help="Classifier-free guidance (a batch of 2 per video).")
        ] = True,
        videos: Annotated[int, typer.Option(help="Videos generated at once.")] = 1,
        out: Annotated[Path, typer.Option(help="Where to write the best plan.")] = Path(
            "plan.json"
        ),
        keep: Annotated[
            int | None, typer.Option(help="Candidates to compile (default: a fifth, <= 3).")
        ] = None,
        top: Annotated[int, typer.Option(help="Rows of the ranked table to print.")] = 10,
        cache_dir: Annotated[
            Path | None,
            typer.Option(help="Reuse compiled candidates from here (keyed by program hash)."),
        ] = DEFAULT_CACHE,
        no_cache: Annotated[bool, typer.Option(help="Compile every candidate afresh.")] = False,
    ):
        """Search sharding plans for a model and video size on a TPU slice; write plan.json."""
        from vidax.models import get
        from vidax.planner.candidates import Workload
        from vidax.planner.search import plan

        spec = get(model)
        height, width = _parse_size(size) if size else (spec.defaults.height, spec.defaults.width)
        workload = Workload(
            model=model,
            frames=frames or spec.defaults.num_frames,
            height=height,
            width=width,
            cfg=cfg,
            videos=videos,
        )
        result = plan(
            workload,
            topology,
            keep=keep,
            cache_dir=None if no_cache else cache_dir,
            log=lambda m: typer.echo(m, err=True),
        )
        typer.echo(result.table(top))
        path = result.best_plan().save(out)
        typer.echo(f"wrote {path} ({result.best.candidate.name}, {result.best.placement.name})")
