"""CLI: `vidax train causal`, the tiny-causal recipe (diffusion forcing, then dense
self-rollout, then sparse self-rollout from the dense weights with the backbone frozen) on the
same typer CLI as `vidax train vae|dit|all`.

    vidax train causal --root runs/tiny-causal --df-steps 600 --final-steps 60
    vidax train causal --root runs/tiny-causal --only sparse --sparse-steps 150
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Annotated

import typer

from vidax.forcing.model import CausalWan, load
from vidax.forcing.train import WEIGHTS_FILE, tiny_causal_stages, train_stage
from vidax.models.registry import ASSETS, get, get_causal, get_vae
from vidax.models.weights import load_transformer, missing_weights
from vidax.text import PromptEmbedder

STAGES = ("df", "dense", "sparse")


def register(train_app: typer.Typer) -> None:
    """Adds `causal` to the `vidax train` group."""
    train_app.command("causal")(train_causal)


def train_causal(
    root: Annotated[Path, typer.Option(help="Run folder: one sub-folder per stage.")] = Path(
        "runs/tiny-causal"
    ),
    df_steps: Annotated[int, typer.Option(help="Diffusion-forcing steps.")] = 600,
    final_steps: Annotated[int, typer.Option(help="Self-rollout steps of dense and sparse.")] = 60,
    sparse_steps: Annotated[
        int | None, typer.Option(help="Steps of the sparse stage (default: --final-steps).")
    ] = None,
    sparse_init: Annotated[
        Path | None,
        typer.Option(
            help="Dense Self-Forcing weights the sparse stage starts from and distils (default: "
            "ROOT/dense/weights.safetensors if the dense stage ran, else the shipped "
            "tiny-causal dense.safetensors)."
        ),
    ] = None,
    sparse_heads: Annotated[
        str,
        typer.Option(
            help="Sparse heads the sparse stage trains: all (branch weight and block "
            "compression) or selection (the block scores only: which blocks are read and kept)."
        ),
    ] = "all",
    batch_size: Annotated[int, typer.Option(help="Clips per self-rollout step.")] = 1,
    df_batch: Annotated[int, typer.Option(help="Clips per diffusion-forcing step.")] = 4,
    df_frames: Annotated[
        int,
        typer.Option(
            help="Pixel frames of the diffusion-forcing clips (1 + 4k; their latent frames a "
            "multiple of the chunk, at most horizon + chunk: 33 or 81 for tiny-causal)."
        ),
    ] = 33,
    df_init: Annotated[
        Path | None,
        typer.Option(
            help="Causal weights diffusion forcing continues from (e.g. an earlier run's "
            "df/weights.safetensors) instead of the bidirectional base DiT; conditioned, like "
            "any df run, through the base model's text encoder unless --text-encoder names the "
            "one they were trained with."
        ),
    ] = None,
    df_seconds: Annotated[
        float | None, typer.Option(help="Stop diffusion forcing after this many seconds.")
    ] = None,
    final_seconds: Annotated[
        float | None, typer.Option(help="Stop each self-rollout stage after this many seconds.")
    ] = None,
    resumable: Annotated[
        bool,
        typer.Option(
            help="Write resumable orbax checkpoints; --no-resumable keeps only each stage's "
            "exported weights (a machine without orbax)."
        ),
    ] = True,
    export_dtype: Annotated[
        str | None, typer.Option(help="dtype of the exported weights (e.g. bfloat16).")
    ] = None,
    rollout_chunks: Annotated[int, typer.Option(help="Chunks per self-rollout.")] = 7,
    teacher_steps: Annotated[int, typer.Option(help="Teacher sampling steps.")] = 6,
    teacher_guidance: Annotated[
        float,
        typer.Option(help="Classifier-free guidance of the dense stage's teacher (1: none)."),
    ] = 1.0,
    cfg_dropout: Annotated[
        float, typer.Option(help="Diffusion forcing: share of clips trained on the empty caption.")
    ] = 0.0,
    only: Annotated[
        str, typer.Option(help="Stages to run, in order (comma-separated: df, dense, sparse).")
    ] = "df,dense,sparse",
    latents: Annotated[
        Path | None, typer.Option(help="Latent cache of the tiny DiT stage (vidax.train.dit).")
    ] = None,
    transformer: Annotated[
        Path | None, typer.Option(help="Bidirectional DiT weights (default: the shipped ones).")
    ] = None,
    vae: Annotated[
        Path | None, typer.Option(help="VAE weights (default: the shipped ones).")
    ] = None,
    text_encoder: Annotated[
        Path | None,
        typer.Option(
            help="Text-encoder weights (default: the base model's when df runs, else the "
            "causal preset's)."
        ),
    ] = None,
    ship: Annotated[
        bool,
        typer.Option(
            help="Copy the trained stages' weights (dense, sparse) into vidax/assets. Ship sparse "
            "weights only if they beat the training-free baseline (the dense weights with the "
            "sparse config) on benchmarks/sparse_forcing.py's long rollouts."
        ),
    ] = False,
) -> None:
    """Train tiny-causal: diffusion forcing from the tiny DiT, Self-Forcing (dense) self-rollout
    from it, then Sparse Forcing (sparse) self-rollout from the trained dense weights with the
    backbone frozen; each stage resumable in its folder."""
    stages = [s.strip() for s in only.split(",") if s.strip()]
    if unknown := [s for s in stages if s not in STAGES]:
        raise ValueError(f"unknown stage(s) {unknown} in --only; stages: {', '.join(STAGES)}")
    if not stages:
        raise ValueError("--only names no stage")
    steps = (("--df-steps", df_steps), ("--final-steps", final_steps))
    for name, value in (*steps, ("--sparse-steps", 1 if sparse_steps is None else sparse_steps)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if export_dtype not in (None, "float32", "bfloat16"):
        raise ValueError(f"--export-dtype must be float32 or bfloat16, got {export_dtype!r}")
    for name, seconds in (("--df-seconds", df_seconds), ("--final-seconds", final_seconds)):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"{name} must be > 0, got {seconds}")
    if df_init is not None and transformer is not None:
        raise ValueError("--df-init and --transformer both name the weights df starts from")
    for path in (latents, transformer, vae, sparse_init, text_encoder, df_init):
        if path is not None and not path.exists():
            raise FileNotFoundError(f"not found: {path}")
    preset = get_causal("tiny-causal")
    spec = preset.spec  # the base model with the preset's VAE
    base = None
    if "df" in stages and df_init is None:  # df starts from the bidirectional DiT
        base_spec = get(preset.base)
        if transformer is None and missing_weights(base_spec, vae=False, text_encoder=False):
            raise ValueError(
                f"the df stage distils {preset.base!r}, which ships no weights: pass "
                "--transformer (vidax/assets/tiny-causal/TRAINING.md says where they are)"
            )
        base = load_transformer(base_spec, transformer)
    if vae is not None:
        vae_spec = get_vae(spec.vae_preset())
        vae_model = vae_spec.loader(vae, vae_spec.config)
    else:
        vae_model = spec.load_vae()
    _, h, w, c = spec.geometry().latent_shape(1, spec.defaults.height, spec.defaults.width)
    configs = tiny_causal_stages(
        df_steps=df_steps,
        final_steps=final_steps,
        sparse_steps=sparse_steps,
        sparse_heads=sparse_heads,
        batch_size=batch_size,
        rollout_chunks=rollout_chunks,
        teacher_steps=teacher_steps,
        latent_hw=(h, w),
        channels=c,
        latents_dir=None if latents is None else str(latents),
        df_batch_size=df_batch,
        df_seconds=df_seconds,
        final_seconds=final_seconds,
        resumable=resumable,
        export_dtype=export_dtype,
        teacher_guidance=teacher_guidance,
        cfg_dropout=cfg_dropout,
        df_frames=df_frames,
    )
    # The text encoder follows the weights a run starts from: df distils the base model (its
    # current encoder), the later stages continue causal weights (the preset's, pinned or not).
    embedder = PromptEmbedder(get(preset.base) if "df" in stages else spec, text_encoder)
    root.mkdir(parents=True, exist_ok=True)

    def weights(stage: str) -> CausalWan:
        path = root / stage / WEIGHTS_FILE
        if not path.exists():
            raise FileNotFoundError(f"stage {stage!r} has no weights yet: {path}")
        return load(path, spec.config)

    def dense_weights() -> Path:
        """What the sparse stage starts from: --sparse-init, this run's dense, the shipped."""
        if sparse_init is not None:
            return sparse_init
        if (root / "dense" / WEIGHTS_FILE).exists():
            return root / "dense" / WEIGHTS_FILE
        shipped = preset.weights_path("dense")
        if shipped is None:
            raise FileNotFoundError(
                "the sparse stage starts from trained dense weights: run the dense stage or "
                "pass --sparse-init"
            )
        return Path(shipped)

    timings = {}
    for stage in stages:
        start = time.time()
        if stage == "df":
            if df_init is not None:
                typer.echo(f"stage df: from the causal weights {df_init}")
                start_model = load(df_init, spec.config)
            else:
                assert base is not None  # loaded above when df starts from the base DiT
                start_model = CausalWan.from_transformer(base)
            train_stage(
                root / stage,
                configs[stage],
                start_model,
                vae=vae_model,
                embedder=embedder,
            )
        elif stage == "dense":
            train_stage(
                root / stage,
                configs[stage],
                weights("df"),
                teacher=weights("df"),
                embedder=embedder,
            )
        else:
            init = dense_weights()
            typer.echo(
                f"stage sparse: from the dense weights {init}, backbone frozen, heads "
                f"{sparse_heads}"
            )
            dense_model = load(init, spec.config)
            train_stage(
                root / stage,
                configs[stage],
                dense_model,
                teacher=load(init, spec.config),
                embedder=embedder,
            )
        timings[stage] = time.time() - start
        typer.echo(f"stage {stage}: {timings[stage] / 60:.1f} min")
    (root / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    if ship:
        if preset.weights is None:
            raise ValueError(f"{preset.name!r} names no weights folder to ship into")
        out = ASSETS / preset.weights
        out.mkdir(parents=True, exist_ok=True)
        for attention in (a for a in ("dense", "sparse") if a in stages):
            shutil.copy(root / attention / WEIGHTS_FILE, out / f"{attention}.safetensors")
        typer.echo(f"shipped to {out}")
