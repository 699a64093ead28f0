"""The training loop shared by every stage: resume, step, log, checkpoint, progress bar.

A stage supplies a train state (`vidax.train.step.init_state`: parameters, optimiser state,
EMA), a jitted `step_fn` (`make_step`) and a resumable batch iterator; `run` does the rest:

    state = run(run_dir, state, step_fn, batches, LoopConfig(steps=1000), mesh=mesh)

Determinism. Batch `s` is a pure function of the iterator state (seed, s) and the step's
random key is `fold_in(key(seed), s)`, so a run killed and resumed from a checkpoint replays
exactly the steps an uninterrupted run would have taken. On resume, `log.jsonl` is cut back to
the checkpoint's step, so the logged loss curve continues without gaps or duplicates.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vidax.data import batch_sharding
from vidax.progress import step_bar
from vidax.train.checkpointing import Checkpointer
from vidax.train.optim import make_optimizer
from vidax.train.step import init_state, train_update

LOG_FILE = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"


def check_curriculum(
    frames: int, short_frames: int, short_fraction: float, *, min_frames: int = 1
) -> None:
    """Validates a short-then-long clip curriculum (both stages train one).

    Args:
        frames: clip length (1 + 4k) of the late steps.
        short_frames: clip length (1 + 4k) of the first `short_fraction` of the steps.
        short_fraction: share of short steps, in [0, 1).
        min_frames: shortest allowed clip.

    Raises:
        ValueError: naming the bad field.
    """
    for name, value in (("frames", frames), ("short_frames", short_frames)):
        if value < min_frames or (value - 1) % 4:
            raise ValueError(f"{name} must be 1 + 4k and >= {min_frames}, got {value}")
    if short_frames > frames:
        raise ValueError(f"short_frames {short_frames} > frames {frames}")
    if not 0.0 <= short_fraction < 1.0:
        raise ValueError(f"short_fraction must be in [0, 1), got {short_fraction}")


class Batches(Protocol):
    """A resumable batch iterator (e.g. `vidax.data.ClipLoader`)."""

    def __next__(self) -> dict[str, Any]: ...

    def get_state(self) -> dict[str, int]: ...

    def set_state(self, state: dict[str, int]) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """How long to train and how often to report and save.

    Attributes:
        steps: total optimiser steps of the run (a resumed run stops at the same total).
        checkpoint_every: save every this many steps (and at the end).
        log_every: print a log line every this many steps when not on a terminal.
        keep: checkpoints kept on disk.
        seed: seed of the per-step random keys.
        max_seconds: stop (saving as at the last step) once this many seconds of steps have
            run, compilation included; None: no limit. The learning-rate schedule still
            spans `steps`: a budget-cut run ends before its schedule does.
        resumable: write resumable orbax checkpoints (and resume from them); False keeps
            only `run`'s `on_checkpoint` calls (an accelerator machine without orbax).
    """

    steps: int
    checkpoint_every: int = 100
    log_every: int = 25
    keep: int = 2
    seed: int = 0
    max_seconds: float | None = None
    resumable: bool = True

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1 or self.log_every < 1 or self.keep < 1:
            raise ValueError("checkpoint_every, log_every and keep must be >= 1")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")

    @classmethod
    def of(cls, stage: Any) -> LoopConfig:
        """The loop of a stage config with `steps`, `checkpoint_every`, `log_every`, `seed`
        (and `max_seconds`, `resumable` where it has them)."""
        return cls(
            steps=stage.steps,
            checkpoint_every=stage.checkpoint_every,
            log_every=stage.log_every,
            seed=stage.seed,
            max_seconds=getattr(stage, "max_seconds", None),
            resumable=getattr(stage, "resumable", True),
        )


def make_step(
    loss_fn: Callable[[Any, Any, jax.Array], tuple[jax.Array, dict]],
    optimizer: optax.GradientTransformation,
    *,
    ema_decay: float,
    seed: int,
    frozen: Sequence[str] = (),
) -> Callable:
    """The shared step (`vidax.train.step.train_update`) as `run` calls it: `(state, batch)
    -> (state, metrics)`, jitted, the state donated, the key fold_in(key(seed), step).

    Args:
        loss_fn: (params, batch, key) -> (scalar loss, dict of scalar metrics).
        optimizer: the optax transformation whose state is `state["opt"]`.
        ema_decay: see `vidax.train.optim.ema_update`.
        seed: the step's key is fold_in(key(seed), step).
        frozen: state entries handed to `loss_fn` in the batch (see `train_update`).
    """
    update = train_update(loss_fn, optimizer, ema_decay=ema_decay, frozen=frozen)

    def step(state, batch):
        return update(state, batch, jax.random.fold_in(jax.random.key(seed), state["step"]))

    return jax.jit(step, donate_argnums=0)


def replicate(tree: Any, mesh: Mesh | None) -> Any:
    """Places every array of `tree` on all devices of `mesh` (no-op without a mesh)."""
    if mesh is None:
        return tree
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def place_batch(batch: dict[str, np.ndarray], mesh: Mesh | None) -> dict[str, jax.Array]:
    """Host arrays -> device arrays, dim 0 split over the mesh's ("data", "fsdp") axes."""
    if mesh is None:
        return {k: jnp.asarray(v) for k, v in batch.items()}
    out = {}
    for key, value in batch.items():
        shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
        sharding = batch_sharding(mesh, value.ndim)
        out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out


def run(
    run_dir: str | os.PathLike,
    state: dict[str, Any],
    step_fn: Callable,
    batches: Batches,
    config: LoopConfig,
    *,
    to_arrays: Callable[[dict[str, Any]], dict[str, np.ndarray]] = lambda b: b,
    mesh: Mesh | None = None,
    meta: dict[str, Any] | None = None,
    description: str = "train",
    on_checkpoint: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Trains until `config.steps`, resuming from the newest checkpoint in `run_dir`.

    Args:
        run_dir: where `checkpoints/` and `log.jsonl` live.
        state: a fresh train state (`vidax.train.step.init_state`); replaced by the
            checkpoint when resuming.
        step_fn: `make_step(...)`.
        batches: resumable iterator; its position is saved with each checkpoint.
        config: steps and intervals.
        to_arrays: host batch -> dict of numpy arrays the step takes (drops captions, specs).
        mesh: data-parallel mesh: state replicated, batches split over ("data", "fsdp").
        meta: run description stored with every checkpoint, as JSON: dataclasses (configs)
            become their fields, values JSON has no type for their `str`.
        description: progress-bar label.
        on_checkpoint: called with (step, state) after each save (e.g. to export weights).

    Returns:
        The final train state.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpointer = (
        Checkpointer(run_dir / CHECKPOINT_DIR, keep=config.keep)
        if config.resumable
        else _NoCheckpoints()
    )
    state = replicate(state, mesh)
    start = 0
    if checkpointer.latest_step() is not None:
        state, saved, start = checkpointer.restore(state)
        batches.set_state(saved["data"])
    log = _Log(run_dir / LOG_FILE, start)
    from rich.console import Console

    console = Console(stderr=True)
    if start:
        console.print(
            f"{description}: resuming from step {start} of {config.steps} ({run_dir})",
            highlight=False,
            soft_wrap=True,
        )
    if start >= config.steps:
        checkpointer.close()
        return state
    meta = _jsonable(meta or {})
    progress = _progress(console, description, config.steps, start)
    last = began = time.perf_counter()
    done_since = 0
    rate = math.nan
    try:
        with progress:
            task = progress.tasks[0].id
            for step in range(start, config.steps):
                batch = place_batch(to_arrays(next(batches)), mesh)
                state, metrics = step_fn(state, batch)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                done_since += 1
                now = time.perf_counter()
                if now - last > 2.0 or step + 1 == config.steps:
                    rate, last, done_since = done_since / (now - last), now, 0
                log.write({"step": step + 1, **metrics, "time": time.time()})
                if not math.isfinite(metrics["loss"]):
                    raise FloatingPointError(f"loss is {metrics['loss']} at step {step + 1}")
                progress.update(task, completed=step + 1, loss=metrics["loss"], rate=rate)
                if not console.is_terminal and (step + 1) % config.log_every == 0:
                    console.print(
                        f"{description} step {step + 1}/{config.steps} "
                        f"loss {metrics['loss']:.4f} {rate:.2f} steps/s",
                        highlight=False,
                    )
                out_of_time = config.max_seconds is not None and now - began >= config.max_seconds
                final = step + 1 == config.steps or out_of_time
                if (step + 1) % config.checkpoint_every == 0 or final:
                    log.flush()
                    checkpointer.save(step + 1, state, {**meta, "data": batches.get_state()})
                    if on_checkpoint is not None:
                        on_checkpoint(step + 1, state)
                if out_of_time and step + 1 < config.steps:
                    console.print(
                        f"{description}: stopped at step {step + 1} of {config.steps}, "
                        f"{config.max_seconds:g} s budget spent",
                        highlight=False,
                    )
                    break
    finally:
        checkpointer.wait()
        checkpointer.close()
        log.close()
    return state


def read_log(run_dir: str | os.PathLike) -> list[dict[str, float]]:
    """The per-step records of a run's `log.jsonl`."""
    path = Path(run_dir) / LOG_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _jsonable(value: Any) -> Any:
    """`value` as plain JSON values (dicts, lists, strings, numbers); see `run`'s `meta`."""

    def default(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.asdict(x)
        return str(x)

    return json.loads(json.dumps(value, default=default))


class _NoCheckpoints:
    """`Checkpointer`'s interface for a run that is not resumable: nothing saved or found."""

    def latest_step(self) -> None:
        return None

    def restore(self, state: Any) -> tuple[Any, dict[str, Any], int]:
        raise RuntimeError("a run that is not resumable has no checkpoint to restore")

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        del step, state, meta

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Log:
    """Appends one JSON line per step; on resume, first drops lines past the checkpoint."""

    def __init__(self, path: Path, start: int):
        kept = [r for r in read_log(path.parent) if r["step"] <= start] if start else []
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        # Kept open for the run (closed in `run`'s finally); line-buffered so that the log can
        # be followed while training.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, float]) -> None:
        self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def _progress(console, description: str, total: int, start: int):
    progress = step_bar(
        console,
        "loss {task.fields[loss]:.4f}",
        "{task.fields[rate]:.2f} steps/s",
        disable=not console.is_terminal,
    )
    progress.add_task(description, total=total, completed=start, loss=math.nan, rate=math.nan)
    return progress


M = TypeVar("M", bound=nnx.Module)


def train_module(
    run_dir: str | os.PathLike,
    module: M,
    loss: Callable[[M, dict[str, Any], jax.Array], tuple[jax.Array, dict]],
    batches: Batches,
    stage: Any,
    *,
    to_arrays: Callable[[dict[str, Any]], dict[str, np.ndarray]],
    mesh: Mesh | None,
    meta: dict[str, Any],
    description: str,
) -> M:
    """Trains (or resumes) the parameters of `module` with `run`; returns the EMA model.

    Args:
        module: the model at its initial weights (its non-parameter state is kept as is).
        loss: (model, batch, key) -> (scalar loss, dict of scalar metrics).
        stage: the stage config: `optim` (its learning rate decays over the steps after the
            warm-up, whatever `optim.decay_steps` says), `steps`, `seed` and `LoopConfig.of`'s
            fields.
        to_arrays, mesh, meta, description: see `run`.
    """
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # type: ignore[misc]  # flax: variadic stub
    optim = dataclasses.replace(stage.optim, decay_steps=max(stage.steps - stage.optim.warmup, 1))
    optimizer = make_optimizer(optim)

    def loss_fn(params, batch, key):
        return loss(nnx.merge(graphdef, params, rest), batch, key)

    step = make_step(loss_fn, optimizer, ema_decay=optim.ema_decay, seed=stage.seed)
    state = run(
        run_dir,
        init_state(params, optimizer),
        step,
        batches,
        LoopConfig.of(stage),
        to_arrays=to_arrays,
        mesh=mesh,
        meta=meta,
        description=description,
    )
    return nnx.merge(graphdef, jax.device_get(state["ema"]), rest)
