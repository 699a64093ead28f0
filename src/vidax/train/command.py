"""CLI: `vidax train vae|dit|export|all` (`vidax eval` is `vidax.eval.command`).

`register(app)` adds the commands to a typer app (the main `vidax` CLI wires it in). Heavy
imports happen inside the commands; bad input raises `ValueError` with the reason.

    vidax train vae --run-dir runs/tiny-vae
    vidax train dit --run-dir runs/tiny-dit --vae-run runs/tiny-vae
    vidax train export --vae-run runs/tiny-vae --dit-run runs/tiny-dit --out runs/export
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

# The options `train vae` and `train dit` share (None: keep the stage config's default).
_Steps = Annotated[int | None, typer.Option(help="Total optimiser steps.")]
_BatchSize = Annotated[int | None, typer.Option(help="Global batch size.")]
_Seed = Annotated[int | None, typer.Option(help="Seed of data, init and noise.")]
_LearningRate = Annotated[float | None, typer.Option(help="Peak learning rate.")]
_ShortFrames = Annotated[
    int | None, typer.Option(help="Clip length of the first --short-fraction of steps.")
]
_ShortFraction = Annotated[float | None, typer.Option(help="Share of short steps.")]
_CheckpointEvery = Annotated[int | None, typer.Option(help="Save every N steps.")]
_DataParallel = Annotated[
    int,
    typer.Option(
        help="Data-parallel devices (a ('data',) mesh over the first N devices; 1: no mesh)."
    ),
]
_VAERun = Annotated[Path, typer.Option(help="Run dir of `vidax train vae`.")]


def register(app: typer.Typer) -> typer.Typer:
    """Adds `train` (with `vae`, `dit`, `export`, `all`) to `app`; returns the `train` group
    (`vidax train causal` joins it from `vidax.forcing.train_command`)."""
    train_app = typer.Typer(
        help="Train vidax's own small text-to-video model (VAE, then DiT).",
        no_args_is_help=True,
    )
    train_app.command("vae")(train_vae)
    train_app.command("dit")(train_dit)
    train_app.command("export")(export)
    train_app.command("all")(train_all)
    app.add_typer(train_app, name="train")
    return train_app


def _mesh(data_parallel: int):
    if data_parallel < 1:
        raise ValueError(f"--data-parallel must be >= 1, got {data_parallel}")
    if data_parallel == 1:
        return None
    import jax

    from vidax.sharding import make_mesh

    if data_parallel > jax.device_count():
        raise ValueError(
            f"--data-parallel {data_parallel} needs {data_parallel} devices, "
            f"{jax.device_count()} available"
        )
    return make_mesh((data_parallel,), ("data",))


def _replace(config, **changes):
    """`config` with the options the user gave (None means: keep the stage default)."""
    return dataclasses.replace(config, **{k: v for k, v in changes.items() if v is not None})


def train_vae(
    run_dir: Annotated[Path, typer.Option(help="Checkpoints, log and exported VAE.")] = Path(
        "runs/tiny-vae"
    ),
    vae: Annotated[str | None, typer.Option(help="VAE preset (default: shapes).")] = None,
    steps: _Steps = None,
    batch_size: _BatchSize = None,
    seed: _Seed = None,
    lr: _LearningRate = None,
    frames: Annotated[int | None, typer.Option(help="Training clip length (1 + 4k).")] = None,
    short_frames: _ShortFrames = None,
    short_fraction: _ShortFraction = None,
    crop: Annotated[int | None, typer.Option(help="Square crop in pixels (0: whole).")] = None,
    checkpoint_every: _CheckpointEvery = None,
    data_parallel: _DataParallel = 1,
) -> None:
    """Train (or resume) the VAE on synthetic shape clips; exports its EMA weights."""
    from vidax.train.vae import STATS_FILE, WEIGHTS_FILE, VAEStageConfig
    from vidax.train.vae import train_vae as run_stage

    config = _replace(
        VAEStageConfig(),
        vae=vae,
        steps=steps,
        batch_size=batch_size,
        seed=seed,
        frames=frames,
        short_frames=short_frames,
        short_fraction=short_fraction,
        crop=crop,
        checkpoint_every=checkpoint_every,
    )
    if lr is not None:
        config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, lr=lr))
    run_stage(run_dir, config, mesh=_mesh(data_parallel))
    typer.echo(f"wrote {run_dir / WEIGHTS_FILE} and {run_dir / STATS_FILE}")


def train_dit(
    run_dir: Annotated[Path, typer.Option(help="Cache, checkpoints, log, exported DiT.")] = Path(
        "runs/tiny-dit"
    ),
    vae_run: _VAERun = Path("runs/tiny-vae"),
    model: Annotated[str | None, typer.Option(help="Transformer preset (default: tiny).")] = None,
    steps: _Steps = None,
    batch_size: _BatchSize = None,
    seed: _Seed = None,
    lr: _LearningRate = None,
    cache_clips: Annotated[int | None, typer.Option(help="Distinct training clips.")] = None,
    frames: Annotated[int | None, typer.Option(help="Clip length (1 + 4k).")] = None,
    short_frames: _ShortFrames = None,
    short_fraction: _ShortFraction = None,
    image_fraction: Annotated[
        float | None, typer.Option(help="Share of single-frame steps, interleaved.")
    ] = None,
    object_weight: Annotated[
        float | None, typer.Option(help="Extra loss weight of latents holding an object.")
    ] = None,
    object_weight_sigma: Annotated[
        float | None, typer.Option(help="Highest noise level the object weight applies at.")
    ] = None,
    sigma_shift: Annotated[
        float | None, typer.Option(help="Shift of the training noise levels (default 3).")
    ] = None,
    warmup: Annotated[int | None, typer.Option(help="Learning-rate warm-up steps.")] = None,
    init: Annotated[
        Path | None, typer.Option(help="Start from these transformer weights (fine-tuning).")
    ] = None,
    checkpoint_every: _CheckpointEvery = None,
    data_parallel: _DataParallel = 1,
) -> None:
    """Train (or resume) the DiT on the trained VAE's latents; exports its EMA weights."""
    from vidax.train.dit import TRANSFORMER_FILE, DiTStageConfig
    from vidax.train.dit import train_dit as run_stage

    if not vae_run.is_dir():
        raise FileNotFoundError(f"VAE run not found: {vae_run} (run `vidax train vae` first)")
    config = _replace(
        DiTStageConfig(),
        model=model,
        steps=steps,
        batch_size=batch_size,
        seed=seed,
        cache_clips=cache_clips,
        frames=frames,
        short_frames=short_frames,
        short_fraction=short_fraction,
        image_fraction=image_fraction,
        object_weight=object_weight,
        object_weight_sigma=object_weight_sigma,
        init=None if init is None else str(init),
        checkpoint_every=checkpoint_every,
    )
    config = dataclasses.replace(
        config,
        optim=_replace(config.optim, lr=lr, warmup=warmup),
        sigma=_replace(config.sigma, shift=sigma_shift),
    )
    run_stage(run_dir, vae_run, config, mesh=_mesh(data_parallel))
    typer.echo(f"wrote {run_dir / TRANSFORMER_FILE}")


def train_all(
    out: Annotated[Path, typer.Option(help="Weights, latent stats, log and summary.")] = Path(
        "runs/tiny-v2"
    ),
    profile: Annotated[str, typer.Option(help="Recipe profile: h200 or smoke.")] = "h200",
    vae_seconds: Annotated[
        float | None, typer.Option(help="Wall-clock budget of the VAE steps.")
    ] = None,
    dit_seconds: Annotated[
        float | None, typer.Option(help="Wall-clock budget of the DiT steps.")
    ] = None,
    batch_scale: Annotated[
        float | None, typer.Option(help="Multiply every bucket's batch size.")
    ] = None,
    seed: _Seed = None,
    total_seconds: Annotated[
        float | None,
        typer.Option(help="Wall-clock budget of the whole run; the DiT stage gets the rest."),
    ] = None,
    vae_from: Annotated[
        Path | None,
        typer.Option(help="Skip the VAE stage: use the VAE an earlier run wrote there."),
    ] = None,
    vae_init: Annotated[
        Path | None,
        typer.Option(help="VAE weights the VAE stage fine-tunes (default: the shipped tiny VAE)."),
    ] = None,
    dit_init: Annotated[
        Path | None,
        typer.Option(
            help="Continue the DiT and text encoder an earlier run wrote there (needs --vae-from)."
        ),
    ] = None,
    vae_decoder_only: Annotated[
        bool,
        typer.Option(
            help="Fine-tune only the VAE's decoder: latents (and a DiT trained on them) unchanged."
        ),
    ] = False,
    vae_only: Annotated[
        bool, typer.Option(help="Stop after the VAE stage (no DiT stage).")
    ] = False,
    vae_buckets: Annotated[
        str | None,
        typer.Option(
            help="Train the VAE on these of the profile's buckets only (comma-separated, "
            "e.g. 33x64x64,33x32x32*3: *W sets a bucket's round-robin weight)."
        ),
    ] = None,
    dit_buckets: Annotated[
        str | None,
        typer.Option(
            help="Train the DiT on these of the profile's buckets only (as --vae-buckets; "
            "DVG buckets are named like 33x64x64/1x2)."
        ),
    ] = None,
) -> None:
    """Train the VAE, the text encoder and the DiT on one accelerator, clips drawn on device."""
    from vidax.train.recipe import fast_gpu_compiles, get_profile
    from vidax.train.recipe import train_all as run_recipe

    fast_gpu_compiles()  # before anything starts jax's backends

    run_recipe(
        out,
        get_profile(
            profile,
            vae_seconds=vae_seconds,
            dit_seconds=dit_seconds,
            batch_scale=batch_scale,
            seed=seed,
            total_seconds=total_seconds,
            vae_init=None if vae_init is None else str(vae_init),
            vae_decoder_only=vae_decoder_only,
            vae_buckets=None if vae_buckets is None else vae_buckets.split(","),
            dit_buckets=None if dit_buckets is None else dit_buckets.split(","),
        ),
        vae_from=vae_from,
        dit_init=dit_init,
        vae_only=vae_only,
    )


def export(
    vae_run: _VAERun = Path("runs/tiny-vae"),
    dit_run: Annotated[Path, typer.Option(help="Run dir of `vidax train dit`.")] = Path(
        "runs/tiny-dit"
    ),
    out: Annotated[
        Path,
        typer.Option(help="Weights folder, for `vidax eval --model tiny-v1 --weights`."),
    ] = Path("runs/export"),
) -> None:
    """Copy the trained VAE and DiT weights (and the latent statistics) into one folder."""
    import shutil

    from vidax.train.dit import TRANSFORMER_FILE
    from vidax.train.vae import STATS_FILE, WEIGHTS_FILE

    # The CPU stages train the first tiny DiT's architecture (`DiTStageConfig.model`,
    # `tiny-v1`); the shipped `tiny` comes from `vidax train all` (`vidax.train.recipe`).
    sources = [vae_run / WEIGHTS_FILE, vae_run / STATS_FILE, dit_run / TRANSFORMER_FILE]
    for path in sources:
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: train both stages first")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vae_run / WEIGHTS_FILE, out / "vae.safetensors")
    shutil.copyfile(dit_run / TRANSFORMER_FILE, out / "transformer.safetensors")
    # `vidax eval --weights` reads the statistics beside the VAE.
    shutil.copyfile(vae_run / STATS_FILE, out / "latent_stats.json")
    typer.echo(f"exported to {out}")
