"""One recipe that trains the whole `tiny` model on one accelerator: `vidax train all`.

The CPU stages (`vidax.train.vae`, `vidax.train.dit`) read clips from a host loader and a
latent cache. On a GPU that would starve the chip, so here every step draws its own clips on
the device (`vidax.data.scene_render`: fresh random scenes, never the same clip twice), encodes them
with the (frozen) VAE and trains on them, all inside one compiled program per clip shape:

1. **VAE**: fine-tunes the shipped `shapes` VAE (or trains a fresh one) on whole frames of
   several sizes and lengths; then measures its latent statistics on fresh clips. With
   `--vae-decoder-only` only the decoder trains: the latents (and a DiT trained on them) stay
   valid, and the statistics are kept.
2. **DiT + text encoder**: a Wan DiT and a `WordEncoder` trained together with flow matching
   on clips of 1 (images), 9, 17, 33 and 81 frames at 32-64 px, including a non-square size, so
   DVG's reduced grids are in distribution.

Each stage runs for a wall-clock budget, not a step count: it compiles every bucket first
(in parallel), measures the step rate on the first steps and then fixes the cosine schedule's
length to what fits the budget. Bucket programs take the learning rate as an argument, so the
schedule never recompiles. EMA weights are written to `out` every `checkpoint_seconds`
(bf16 safetensors for the DiT and the text encoder), so a run cut off early still yields a
usable model.

    vidax train all --profile h200 --out runs/tiny-v2      # ~9 min on one H200
    vidax train all --profile smoke --out /tmp/smoke       # seconds of steps on a CPU
    vidax train all --vae-decoder-only --vae-only --out runs/vae   # a sharper decoder only
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vidax.checkpoint import save_model, write_atomic
from vidax.data import scene_render
from vidax.dvg.schedule import reduced_shape
from vidax.dvg.transition import downsample
from vidax.dvg.transition import positions as dvg_positions
from vidax.models import wan, wan_vae, word_encoder
from vidax.models.registry import ASSETS, ModelSpec, get
from vidax.models.wan import WanTransformer, key_map
from vidax.models.word_encoder import WordEncoder
from vidax.text.hashed import HashedTextEmbedder
from vidax.train.dit import DiTStageConfig, adaln_zero, dit_loss, latent_object_mask
from vidax.train.flow import SigmaSampler
from vidax.train.optim import OptimConfig, make_optimizer
from vidax.train.step import init_state, train_update
from vidax.train.vae import (
    VAEStageConfig,
    build_vae,
    latent_stats,
    moments,
    resolve_conv_impl,
    vae_loss,
)

TRANSFORMER_FILE = "transformer.safetensors"
TEXT_ENCODER_FILE = "text_encoder.safetensors"
VAE_FILE = "vae.safetensors"
STATS_FILE = "latent_stats.json"
LOG_FILE = "log.jsonl"
SUMMARY_FILE = "recipe.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bucket:
    """One clip shape a stage trains on: a compiled program of its own.

    Attributes:
        frames: clip length (1 + 4k; 1 is an image).
        height, width: pixels (multiples of 8: the VAE's 4x and the patch's 2x).
        batch: clips per step.
        weight: share of the stage's steps (relative to the other buckets).
        reduce: (time, space) factors of a DVG bucket (DiT stage only): the clip's latents
            are restricted to DVG's reduced grid (`vidax.dvg.transition.downsample`: nested
            frames, DCT low-pass) and the model sees that grid's RoPE positions in
            full-resolution coordinates, which is exactly what DVG's reduced stages feed it.
            The latents of a smaller rendered clip are not that signal (44% relative squared
            error at space /2), so rendered small sizes alone do not make a DiT
            resolution-consistent (docs/results.md).
    """

    frames: int
    height: int
    width: int
    batch: int
    weight: float = 1.0
    reduce: tuple[int, int] = (1, 1)

    def __post_init__(self):
        if self.frames < 1 or (self.frames - 1) % 4:
            raise ValueError(f"Bucket.frames must be 1 + 4k, got {self.frames}")
        for name in ("height", "width"):
            value = getattr(self, name)
            if value < 16 or value % 8:
                raise ValueError(f"Bucket.{name} must be a multiple of 8 >= 16, got {value}")
        if self.batch < 1 or not self.weight > 0:
            raise ValueError(f"Bucket needs batch >= 1 and weight > 0, got {self}")
        if self.reduce[0] not in (1, 2, 4, 8) or self.reduce[1] not in (1, 2, 4):
            raise ValueError(f"Bucket.reduce must be (1|2|4|8, 1|2|4), got {self.reduce}")

    @property
    def name(self) -> str:
        name = f"{self.frames}x{self.height}x{self.width}"
        return name if self.reduce == (1, 1) else f"{name}/{self.reduce[0]}x{self.reduce[1]}"


def reduced_token_grid(
    bucket: Bucket, factors: tuple[int, int], patch: tuple[int, int, int]
) -> tuple[int, int, int] | None:
    """The DiT's token grid for `bucket`'s clips after its DVG reduction, or None where the
    reduction or the patch does not divide the latent grid.

    Args:
        factors: the VAE's (temporal, spatial) compression.
        patch: the DiT's (pt, ph, pw).
    """
    tf, sf = factors
    latent = (1 + (bucket.frames - 1) // tf, bucket.height // sf, bucket.width // sf)
    try:
        reduced = reduced_shape(latent, bucket.reduce)  # DVG's own grid arithmetic
    except ValueError:
        return None
    if any(n % p for n, p in zip(reduced, patch, strict=True)):
        return None
    return tuple(n // p for n, p in zip(reduced, patch, strict=True))  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageSettings:
    """How one stage trains.

    Attributes:
        buckets: clip shapes, visited in a fixed weighted round robin.
        seconds: wall-clock budget of the steps (after compilation).
        max_steps: upper bound on the steps (the budget usually decides).
        lr, warmup, min_lr_ratio: peak learning rate, linear warm-up steps, cosine floor.
        weight_decay, ema_decay: AdamW decay (rank >= 2 parameters) and weight EMA.
        calibration_steps: steps timed before the schedule's length is fixed.
    """

    buckets: tuple[Bucket, ...]
    seconds: float
    max_steps: int
    lr: float
    warmup: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    ema_decay: float = 0.999
    calibration_steps: int = 40

    def __post_init__(self):
        if not self.buckets:
            raise ValueError("a stage needs at least one bucket")
        if not self.seconds > 0 or self.max_steps < 1:
            raise ValueError(f"need seconds > 0 and max_steps >= 1, got {self}")
        if not self.lr > 0 or self.warmup < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"bad learning-rate settings: {self}")
        if not 0 <= self.ema_decay < 1 or self.calibration_steps < 1:
            raise ValueError(f"need 0 <= ema_decay < 1 and calibration_steps >= 1: {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """A whole recipe: the model, the dtypes and both stages.

    Attributes:
        name: profile name (`PROFILES`).
        model: registry preset trained (a Wan DiT with a `text_config` and a VAE).
        dtype: compute dtype of the DiT and text encoder (parameters stay float32).
        vae_init: VAE weights to fine-tune (default: the shipped `tiny` VAE), or None to
            train one from scratch.
        vae_decoder_only: fine-tune only the VAE's decoder (and `post_quant_conv`): the
            encoder, hence the latents and their statistics (`latent_stats.json` beside
            `vae_init`), stay exactly as they were, so a DiT trained on them still fits.
        vae, dit: the two stages.
        stats_clips: fresh 33-frame 64x64 clips the latent statistics are measured on.
        checkpoint_seconds: write the EMA weights at least this often.
        log_every: steps between log lines.
        seed: seed of data, init and noise.
        object_weight: extra low-noise loss weight of latents that hold an object
            (`DiTStageConfig.object_weight`).
        total_seconds: wall-clock budget of the whole run, compilation included; the DiT
            stage gets what is left of it (at most `dit.seconds`). None: no overall limit.
    """

    name: str
    model: str = "tiny"
    dtype: str = "bfloat16"
    vae_init: str | None = str(ASSETS / "tiny" / VAE_FILE)
    vae_decoder_only: bool = False
    vae: StageSettings
    dit: StageSettings
    stats_clips: int = 256
    checkpoint_seconds: float = 120.0
    log_every: int = 100
    seed: int = 0
    object_weight: float = 4.0
    total_seconds: float | None = None

    def __post_init__(self):
        spec = get(self.model)
        if spec.family != "wan" or spec.text_config is None or spec.vae is None:
            raise ValueError(
                f"model {self.model!r} must be a Wan preset with a VAE and a trained text "
                "encoder (text_config) to train with this recipe"
            )
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype must be bfloat16 or float32, got {self.dtype!r}")
        if self.stats_clips < 8 or not self.checkpoint_seconds > 0 or self.log_every < 1:
            raise ValueError(f"bad profile settings: {self}")
        if self.total_seconds is not None and not self.total_seconds > 0:
            raise ValueError(f"total_seconds must be positive, got {self.total_seconds}")
        if any(b.reduce != (1, 1) for b in self.vae.buckets):
            raise ValueError("VAE buckets train on whole frames: reduce must be (1, 1)")
        vae = wan_vae.PRESETS[spec.vae_preset()]
        factors, patch = (vae.temporal_factor, vae.spatial_factor), spec.config.patch_size
        for bucket in self.dit.buckets:  # one line now, not a shape error inside a compile
            if reduced_token_grid(bucket, factors, patch) is None:
                raise ValueError(
                    f"bucket {bucket.name}: its latent grid reduced by {bucket.reduce} does "
                    f"not fit the patch {patch}"
                )
        if self.vae_init is not None and not Path(self.vae_init).is_file():
            raise FileNotFoundError(f"VAE weights to fine-tune not found: {self.vae_init}")
        if self.vae_decoder_only:
            if self.vae_init is None:
                raise ValueError("vae_decoder_only fine-tunes a VAE: it needs vae_init")
            if not self.vae_init_stats.is_file():
                raise FileNotFoundError(
                    "vae_decoder_only keeps the encoder's latent statistics, but "
                    f"{self.vae_init_stats} (beside vae_init) is missing"
                )

    @property
    def spec(self) -> ModelSpec:
        return get(self.model)

    @property
    def vae_init_stats(self) -> Path:
        """The latent statistics beside `vae_init` (what a decoder-only stage keeps)."""
        assert self.vae_init is not None
        return Path(self.vae_init).parent / STATS_FILE


PROFILES: dict[str, Profile] = {
    # One H200, ~9 minutes including compilation. Token counts per step are kept within ~2x
    # of each other so every bucket's step costs about the same; 33-frame 64x64 clips (what
    # `vidax generate` makes by default) get the largest share.
    "h200": Profile(
        name="h200",
        vae=StageSettings(
            # Small frames get half the steps: at 32x32 an object is 5-9 px across, 1-2 latent
            # pixels, and the first fine-tune (a fifth of its steps there) kept only 0.60 of the
            # fixed prompts' objects in a round trip, against 0.96 at 64x64.
            buckets=(
                Bucket(frames=1, height=64, width=64, batch=64, weight=1),
                Bucket(frames=9, height=64, width=64, batch=24, weight=1),
                Bucket(frames=33, height=64, width=64, batch=8, weight=2),
                Bucket(frames=17, height=48, width=64, batch=16, weight=1),
                Bucket(frames=33, height=32, width=32, batch=24, weight=2),
                Bucket(frames=9, height=32, width=32, batch=64, weight=2),
                Bucket(frames=17, height=48, width=48, batch=16, weight=1),
            ),
            seconds=100.0,
            max_steps=100_000,
            lr=3e-4,
            warmup=50,
            ema_decay=0.995,
            weight_decay=1e-4,
        ),
        dit=StageSettings(
            buckets=(
                Bucket(frames=1, height=64, width=64, batch=256, weight=2),
                Bucket(frames=1, height=32, width=32, batch=512, weight=1),
                Bucket(frames=9, height=64, width=64, batch=96, weight=1),
                Bucket(frames=9, height=48, width=48, batch=160, weight=1),
                Bucket(frames=17, height=32, width=32, batch=256, weight=1),
                Bucket(frames=17, height=48, width=64, batch=96, weight=2),
                Bucket(frames=33, height=32, width=32, batch=128, weight=1),
                Bucket(frames=33, height=48, width=48, batch=64, weight=1),
                Bucket(frames=33, height=64, width=64, batch=48, weight=6),
                # DVG's reduced stages at the default size (what `vidax generate --accel dvg`
                # feeds the model there): space /2 (8x8 latents), time /4 and /8 (3 and 2 of
                # the 9 latent frames: the selector's temporal schedules, docs/dvg.md §6.5).
                Bucket(frames=33, height=64, width=64, batch=48, weight=2, reduce=(1, 2)),
                Bucket(frames=33, height=64, width=64, batch=48, weight=1, reduce=(4, 1)),
                Bucket(frames=33, height=64, width=64, batch=48, weight=1, reduce=(8, 1)),
                # Wan 2.1's own clip length (81 frames, 21 latent frames) and DVG's time /2 and
                # /4 grids there (11 and 6 latent frames), what DVG's temporal stages feed the
                # model at that length. `tiny` run8 trained these three at weights 4/2/2 beside
                # a subset of the others (docs/tpu.md, fourteenth session; docs/dvg.md §6.9).
                # Like the DVG buckets above, the reduced ones carry fewer tokens per step.
                Bucket(frames=81, height=64, width=64, batch=16, weight=2),
                Bucket(frames=81, height=64, width=64, batch=16, weight=1, reduce=(2, 1)),
                Bucket(frames=81, height=64, width=64, batch=16, weight=1, reduce=(4, 1)),
            ),
            seconds=330.0,
            max_steps=1_000_000,
            lr=6e-4,
            warmup=300,
            ema_decay=0.999,
        ),
    ),
    # A few steps of each stage at toy batch sizes: the code path of "h200" on a CPU
    # (the test suite runs it) or a first look at a new accelerator.
    "smoke": Profile(
        name="smoke",
        dtype="float32",
        vae=StageSettings(
            buckets=(Bucket(frames=5, height=16, width=24, batch=1),),
            seconds=600.0,
            max_steps=3,
            lr=3e-4,
            warmup=1,
            calibration_steps=2,
        ),
        dit=StageSettings(
            buckets=(
                Bucket(frames=1, height=32, width=32, batch=2),
                Bucket(frames=9, height=16, width=24, batch=2),
                Bucket(frames=9, height=32, width=32, batch=2, reduce=(1, 2)),
            ),
            seconds=600.0,
            max_steps=4,
            lr=6e-4,
            warmup=1,
            calibration_steps=2,
        ),
        stats_clips=8,
        log_every=1,
    ),
}


def get_profile(
    name: str,
    *,
    vae_seconds: float | None = None,
    dit_seconds: float | None = None,
    batch_scale: float | None = None,
    seed: int | None = None,
    total_seconds: float | None = None,
    vae_init: str | None = None,
    vae_decoder_only: bool | None = None,
    vae_buckets: Sequence[str] | None = None,
    dit_buckets: Sequence[str] | None = None,
) -> Profile:
    """The profile `name`, with stage budgets, batch sizes (scaled, at least 1), the seed, the
    run's budget, the VAE to fine-tune or what of it trains changed where given, and a stage
    restricted to the buckets listed in `vae_buckets` / `dit_buckets` (`select_buckets`); a
    clear error lists the known profiles or buckets."""
    try:
        profile = PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}"
        ) from None
    if batch_scale is not None and not batch_scale > 0:
        raise ValueError(f"batch scale must be positive, got {batch_scale}")

    def stage(settings: StageSettings, seconds: float | None) -> StageSettings:
        buckets = settings.buckets
        if batch_scale is not None:
            buckets = tuple(
                dataclasses.replace(b, batch=max(1, round(b.batch * batch_scale))) for b in buckets
            )
        seconds = settings.seconds if seconds is None else seconds
        return dataclasses.replace(settings, buckets=buckets, seconds=seconds)

    vae, dit = profile.vae, profile.dit
    if vae_buckets is not None:
        vae = dataclasses.replace(vae, buckets=select_buckets(vae.buckets, vae_buckets, "VAE"))
    if dit_buckets is not None:
        dit = dataclasses.replace(dit, buckets=select_buckets(dit.buckets, dit_buckets, "DiT"))
    return dataclasses.replace(
        profile,
        vae=stage(vae, vae_seconds),
        dit=stage(dit, dit_seconds),
        seed=profile.seed if seed is None else seed,
        total_seconds=profile.total_seconds if total_seconds is None else total_seconds,
        vae_init=profile.vae_init if vae_init is None else vae_init,
        vae_decoder_only=(
            profile.vae_decoder_only if vae_decoder_only is None else vae_decoder_only
        ),
    )


def select_buckets(
    buckets: Sequence[Bucket], names: Sequence[str], stage: str
) -> tuple[Bucket, ...]:
    """The buckets named in `names` (`Bucket.name`, e.g. "33x32x32" or "33x64x64/1x2"), in
    that order, each optionally with a new round-robin weight ("33x32x32*3")."""
    known = {b.name: b for b in buckets}
    chosen, unknown = [], []
    for entry in names:
        name, _, weight = entry.partition("*")
        if name not in known:
            unknown.append(entry)
            continue
        bucket = known[name]
        if weight:
            try:
                bucket = dataclasses.replace(bucket, weight=float(weight))
            except ValueError:
                raise ValueError(f"bad {stage} bucket weight in {entry!r}") from None
        chosen.append(bucket)
    if unknown or not chosen:
        raise ValueError(
            f"unknown {stage} bucket(s) {', '.join(unknown) or '(none given)'}; the profile has "
            f"{', '.join(known)}"
        )
    return tuple(chosen)


# ------------------------------------------------------------------------- the timed loop


def round_robin(buckets: Sequence[Bucket]) -> list[int]:
    """One cycle of bucket indices, each appearing `weight` times (weights rounded to
    integers >= 1), spread evenly (smooth weighted round robin)."""
    weights = [max(1, round(b.weight)) for b in buckets]
    current = [0] * len(weights)
    order = []
    for _ in range(sum(weights)):
        current = [c + w for c, w in zip(current, weights, strict=True)]
        i = max(range(len(weights)), key=lambda j: current[j])
        current[i] -= sum(weights)
        order.append(i)
    return order


def lr_at(step: int, total: int, settings: StageSettings) -> float:
    """Linear warm-up to `lr`, then cosine decay to `min_lr_ratio * lr` at `total`."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    span = max(total - settings.warmup, 1)
    progress = min((step - settings.warmup) / span, 1.0)
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def compile_buckets(
    step_fns: Sequence[jax.stages.Wrapped], state, frozen, log, *, threads: int | None = None
) -> list[Callable]:
    """Lowers every bucket's step (`train_update`: `(state, frozen, key, lr)`) in turn, then
    compiles them in parallel threads (XLA compiles outside the GIL): compile time is the
    longest program's, not the sum. `threads` bounds how many compile at once (each holds
    its own host memory; default: all)."""
    started = time.perf_counter()
    key = jax.random.key(0)
    lr = jnp.float32(0.0)
    lowered = [f.lower(state, frozen, key, lr) for f in step_fns]
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads or len(lowered)) as pool:
        compiled = list(pool.map(lambda low: low.compile(), lowered))
    log(f"compiled {len(compiled)} programs in {time.perf_counter() - started:.1f}s")
    return compiled


def run_stage(
    name: str,
    settings: StageSettings,
    compiled: Sequence[Callable],
    state: dict,
    frozen: Any,
    *,
    seed: int,
    log_every: int,
    checkpoint_seconds: float,
    save: Callable[[dict, int], None],
    log: Callable[[str], None],
    write_log: Callable[[dict], None],
    deadline: float | None = None,
) -> tuple[dict, dict]:
    """Runs a stage for `settings.seconds` (or to `deadline`, or `max_steps`); returns
    (state, summary).

    The first `calibration_steps` run at the warm-up learning rate and are timed one by one
    (per bucket, for the summary); the schedule's total is then the steps that fit the
    remaining budget at their mean rate.
    """
    order = round_robin(settings.buckets)
    names = [b.name for b in settings.buckets]
    base = jax.random.key(seed)
    total = settings.max_steps
    started = time.perf_counter()
    budget = settings.seconds
    if deadline is not None:  # keep ~10 s for the last save and the summary
        budget = max(min(budget, deadline - started - 10.0), 1.0)
        log(f"{name}: {budget:.0f}s of steps left before the run's deadline")
    last_save = started
    step = 0
    metrics = None
    timings: dict[str, list[float]] = {}
    calibrating = True
    while step < total:
        bucket = order[step % len(order)]
        lr = jnp.float32(lr_at(step, total, settings))
        tick = time.perf_counter()
        state, metrics = compiled[bucket](state, frozen, jax.random.fold_in(base, step), lr)
        step += 1
        if calibrating:
            jax.block_until_ready(metrics)
            timings.setdefault(names[bucket], []).append(time.perf_counter() - tick)
            if step == min(settings.calibration_steps, total):
                elapsed = time.perf_counter() - started
                rate = elapsed / step
                fits = step + int((budget - elapsed) / rate)
                total = max(step, min(settings.max_steps, fits))
                calibrating = False
                log(f"{name}: {rate * 1e3:.1f} ms/step over {step} steps -> {total} steps")
        if step % log_every == 0 or step == total:
            values = {k: float(v) for k, v in jax.device_get(metrics).items()}
            now = time.perf_counter()
            write_log(
                {
                    "stage": name,
                    "step": step,
                    "total": total,
                    "bucket": names[bucket],
                    "lr": float(lr),
                    "seconds": round(now - started, 2),
                    **values,
                }
            )
            log(
                f"{name} {step}/{total} [{names[bucket]}] "
                f"loss {values['loss']:.4f} lr {float(lr):.2e} {now - started:.0f}s"
            )
            if not math.isfinite(values["loss"]):
                raise FloatingPointError(f"{name}: non-finite loss at step {step}")
            if now - last_save >= checkpoint_seconds:
                save(state, step)
                last_save = time.perf_counter()
            if now - started > budget * 1.05 + 5:  # the estimate was optimistic
                log(f"{name}: out of time at step {step} of {total}")
                break
    jax.block_until_ready(state)
    seconds = time.perf_counter() - started
    save(state, step)
    # A program's first run may include one-off work: time the later ones where there are.
    per_bucket = {
        b: round(1e3 * float(np.median(t[1:] if len(t) > 1 else t)), 2) for b, t in timings.items()
    }
    clips = sum(settings.buckets[order[i % len(order)]].batch for i in range(step))
    log(f"{name}: ms/step by bucket {per_bucket}")
    return state, {
        "steps": step,
        "clips": clips,
        "seconds": round(seconds, 1),
        "ms_per_step": round(1e3 * seconds / max(step, 1), 2),
        "ms_per_step_by_bucket": per_bucket,
        "final_loss": None if metrics is None else float(jax.device_get(metrics)["loss"]),
    }


# ------------------------------------------------------------------------- the stages


def _optimizer(settings: StageSettings) -> optax.GradientTransformation:
    """AdamW at learning rate 1: each step scales its update by `lr_at` (`train_update`)."""
    return make_optimizer(
        OptimConfig(lr=1.0, warmup=0, weight_decay=settings.weight_decay, ema_decay=0.0)
    )


_VAE_COMPILE_THREADS = 4


def train_vae_stage(profile: Profile, out: Path, log, write_log) -> tuple[wan_vae.WanVAE, dict]:
    """Stage 1; returns the EMA VAE with its latent statistics, and a summary.

    The statistics are measured on fresh clips after training, or, when only the decoder
    trains (`Profile.vae_decoder_only`), copied from beside `vae_init`: the latents are the
    same, and re-measuring them on another sample would move a trained DiT's inputs.
    """
    spec = profile.spec
    stage_config = VAEStageConfig(vae=spec.vae_preset(), crop=0, seed=profile.seed)
    if profile.vae_init is not None:
        vae = wan_vae.load(profile.vae_init, stage_config.model_config)
        log(f"vae: fine-tuning {profile.vae_init}")
    else:
        vae = build_vae(stage_config)
    # `trained` are the parameters differentiated; `fixed` the rest, passed to each step as
    # its frozen input (empty unless only the decoder trains).
    if profile.vae_decoder_only:
        trained_filter: Any = nnx.All(
            nnx.Param, nnx.Any(nnx.PathContains("decoder"), nnx.PathContains("post_quant_conv"))
        )
        log("vae: training the decoder only (encoder and latent statistics kept)")
    else:
        trained_filter = nnx.Param
    graphdef, params, fixed, rest = nnx.split(vae, trained_filter, nnx.Param, ...)  # type: ignore[misc]  # flax: variadic stub
    settings = profile.vae
    optimizer = _optimizer(settings)

    def loss_for(bucket: Bucket):
        def loss_fn(params, fixed, key):
            k_scene, k_post = jax.random.split(key)
            scenes = scene_render.sample_scenes(k_scene, bucket.batch)
            video = scene_render.render(scenes, bucket.frames, bucket.height, bucket.width)
            return vae_loss(nnx.merge(graphdef, params, fixed, rest), video, k_post, stage_config)

        return train_update(loss_fn, optimizer, ema_decay=settings.ema_decay)

    state = init_state(params, optimizer)

    def save(state, step):
        model = nnx.merge(graphdef, jax.device_get(state["ema"]), fixed, rest)
        write_atomic(out / VAE_FILE, lambda p: wan_vae.save(model, p))
        log(f"vae: saved EMA weights at step {step}")

    # The stage's VAE computes its 3D convolutions as sums of 2D ones on a CPU
    # (`VAEStageConfig.conv_impl`), natively elsewhere. Compiling one 33-frame VAE step for a
    # TPU v5e peaks at 4-6 GB of host memory: the h200 profile's 7 at once exhausted the
    # 40 GiB host of a v5e machine (2026-12-06), so at most `_VAE_COMPILE_THREADS` at a time.
    compiled = compile_buckets(
        [loss_for(b) for b in settings.buckets], state, fixed, log, threads=_VAE_COMPILE_THREADS
    )
    state, summary = run_stage(
        "vae",
        settings,
        compiled,
        state,
        fixed,
        seed=profile.seed,
        log_every=profile.log_every,
        checkpoint_seconds=profile.checkpoint_seconds,
        save=save,
        log=log,
        write_log=write_log,
    )
    ema = nnx.merge(graphdef, state["ema"], fixed, rest)
    if profile.vae_decoder_only:
        stats = json.loads(profile.vae_init_stats.read_text())
        log("vae: latent stats kept from the encoder's")
    else:
        stats = latent_stats(
            ema, clips=profile.stats_clips, batch=64, draw=_rendered_clips(profile.seed + 1)
        )
        log(f"vae: latent stats {stats}")
    (out / STATS_FILE).write_text(json.dumps(stats, indent=1) + "\n")
    config = dataclasses.replace(
        wan_vae.PRESETS[spec.vae_preset()],
        latents_mean=tuple(stats["mean"]),
        latents_std=tuple(stats["std"]),
    )
    normalised = wan_vae.WanVAE(config, rngs=nnx.Rngs(0))
    nnx.update(normalised, nnx.state(ema))
    return normalised, {**summary, "latent_stats": stats}


def _rendered_clips(seed: int) -> Callable[[int, int], jax.Array]:
    """`latent_stats`'s `draw`: batch i of fresh 33-frame 64x64 clips rendered on the device."""

    @functools.partial(jax.jit, static_argnums=1)
    def render(key, n):
        return scene_render.render(scene_render.sample_scenes(key, n), 33, 64, 64)

    return lambda i, n: render(jax.random.fold_in(jax.random.key(seed), i), n)


def train_dit_stage(
    profile: Profile,
    vae: wan_vae.WanVAE,
    out: Path,
    log,
    write_log,
    *,
    deadline: float | None = None,
    check_only: bool = False,
    dit_init: str | os.PathLike | None = None,
) -> tuple[nnx.Module, nnx.Module, dict] | None:
    """Stage 2: the DiT and the text encoder on latents of the (frozen) VAE.

    `dit_init`: start from the (EMA, bf16) DiT and text encoder an earlier run wrote to that
    folder instead of a fresh initialisation; the optimiser state and schedule start afresh.

    `check_only` traces every bucket's step abstractly (`jax.eval_shape`) and returns None:
    a preflight that finds this stage's errors in seconds, before the VAE stage runs.
    """
    spec = profile.spec
    settings = profile.dit
    dtype = dict(dtype=profile.dtype, param_dtype="float32")
    dit_config = dataclasses.replace(spec.config, **dtype)
    text_config = dataclasses.replace(spec.text_config, **dtype)
    rngs = nnx.Rngs(profile.seed)
    if dit_init is None:
        dit = adaln_zero(WanTransformer(dit_config, rngs=rngs))
        text = WordEncoder(text_config, rngs=rngs)
    else:
        dit, text = load_recipe_dit(dit_init, dit_config, text_config)
        log(f"dit: continuing from {dit_init}")
    dit_graph, dit_params, dit_rest = nnx.split(dit, nnx.Param, ...)  # type: ignore[misc]  # flax: variadic stub
    text_graph, text_params, text_rest = nnx.split(text, nnx.Param, ...)  # type: ignore[misc]  # flax: variadic stub
    # Encode in the compute dtype (bf16 convolutions run on the tensor cores; the latents'
    # ~0.4% rounding is far below the VAE's own round-trip error); parameters stay float32.
    # 3D convolutions are sums of 2D ones on a CPU (`resolve_conv_impl`), native elsewhere.
    encoder = wan_vae.WanVAE(
        dataclasses.replace(vae.config, dtype=profile.dtype, conv_impl=resolve_conv_impl()),
        rngs=rngs,
    )
    nnx.update(encoder, nnx.state(vae))
    vae_graph, vae_state = nnx.split(encoder)
    embedder = HashedTextEmbedder(dim=text_config.in_dim, text_len=text_config.text_len)
    loss_config = DiTStageConfig(
        model=profile.model,
        cfg_dropout=0.1,
        object_weight=profile.object_weight,
        sigma=SigmaSampler(mean=0.0, std=1.0, shift=3.0),
    )
    optimizer = _optimizer(settings)
    tf, sf = vae.config.temporal_factor, vae.config.spatial_factor

    patch = dit_config.patch_size

    def loss_for(bucket: Bucket):
        positions = None
        if bucket.reduce != (1, 1):  # a host constant: DVG's reduced-grid RoPE positions
            grid = reduced_token_grid(bucket, (tf, sf), patch)
            assert grid is not None  # Profile checked every bucket
            positions = jnp.asarray(dvg_positions(grid, bucket.reduce, patch))

        def loss_fn(params, frozen, key):
            k_scene, k_loss = jax.random.split(key)
            scenes = scene_render.sample_scenes(k_scene, bucket.batch)
            video = scene_render.render(scenes, bucket.frames, bucket.height, bucket.width)
            encoder = nnx.merge(vae_graph, frozen)
            latents = encoder.normalize(moments(encoder, video)[0]).astype(jnp.float32)
            objects = latent_object_mask(video, tf, sf).astype(jnp.float32)
            if bucket.reduce != (1, 1):
                latents = downsample(latents, bucket.reduce)
                # A loss weight only: a reduced latent holds an object where its low-passed
                # mask does (the DCT's ringing stays below the threshold).
                objects = (downsample(objects, bucket.reduce) > 0.25).astype(jnp.float32)
            words, mask = scene_render.caption_embeddings(scenes, embedder)
            context = nnx.merge(text_graph, params["text"], text_rest)(words, mask)
            batch = {
                "latents": jax.lax.stop_gradient(latents),
                "objects": objects,
                "context": context,
            }
            if positions is not None:
                batch["positions"] = positions
            model = nnx.merge(dit_graph, params["dit"], dit_rest)
            return dit_loss(model, batch, k_loss, loss_config)

        return train_update(loss_fn, optimizer, ema_decay=settings.ema_decay)

    state = init_state({"dit": dit_params, "text": text_params}, optimizer)

    def models(state):
        ema = jax.device_get(state["ema"])
        return (
            nnx.merge(dit_graph, ema["dit"], dit_rest),
            nnx.merge(text_graph, ema["text"], text_rest),
        )

    def save(state, step):
        dit_ema, text_ema = models(state)
        meta = {"step": str(step), "profile": profile.name}
        write_atomic(
            out / TRANSFORMER_FILE,
            lambda p: save_model(
                dit_ema, p, key_map(dit_config), dtype=jnp.bfloat16, metadata=meta
            ),
        )
        write_atomic(
            out / TEXT_ENCODER_FILE,
            lambda p: word_encoder.save(text_ema, p, dtype=jnp.bfloat16, metadata=meta),
        )
        log(f"dit: saved EMA weights at step {step}")

    step_fns = [loss_for(b) for b in settings.buckets]
    if check_only:
        for fn in step_fns:
            jax.eval_shape(fn, state, vae_state, jax.random.key(0), jnp.float32(0.0))
        log(f"dit: preflight traced {len(step_fns)} programs")
        return None
    compiled = compile_buckets(step_fns, state, vae_state, log)
    state, summary = run_stage(
        "dit",
        settings,
        compiled,
        state,
        vae_state,
        seed=profile.seed + 2,
        log_every=profile.log_every,
        checkpoint_seconds=profile.checkpoint_seconds,
        save=save,
        log=log,
        write_log=write_log,
        deadline=deadline,
    )
    dit_ema, text_ema = models(state)
    return dit_ema, text_ema, summary


def fast_gpu_compiles() -> None:
    """Turns XLA:GPU's autotuning off (`--xla_gpu_autotune_level=0`) unless XLA_FLAGS sets it.

    With it on, compiling the VAE stage's five programs took 418 s on an H200 (each conv
    algorithm timed on the device, the programs' autotuners contending for it), most of a
    9-minute budget. Takes effect only before jax starts its backends (the CLI calls it first).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_autotune_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_autotune_level=0".strip()


def load_recipe_vae(folder: str | os.PathLike, preset: str) -> wan_vae.WanVAE:
    """The VAE a recipe run wrote to `folder`, normalised by its `latent_stats.json`."""
    folder = Path(folder)
    for name in (VAE_FILE, STATS_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} not found: not a finished VAE stage")
    stats = json.loads((folder / STATS_FILE).read_text())
    config = dataclasses.replace(
        wan_vae.PRESETS[preset],
        latents_mean=tuple(stats["mean"]),
        latents_std=tuple(stats["std"]),
    )
    return wan_vae.load(folder / VAE_FILE, config)


def load_recipe_dit(
    folder: str | os.PathLike,
    dit_config: Any,
    text_config: Any,
) -> tuple[WanTransformer, WordEncoder]:
    """The DiT and text encoder a recipe run wrote to `folder`, as `dit_config`/`text_config`
    (parameters in their `param_dtype`: bf16 files come back as float32 master weights)."""
    folder = Path(folder)
    for name in (TRANSFORMER_FILE, TEXT_ENCODER_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} not found: not a recipe run's DiT stage")
    dit = wan.load(folder / TRANSFORMER_FILE, dit_config)
    return dit, word_encoder.load(folder / TEXT_ENCODER_FILE, text_config)


def train_all(
    out: str | os.PathLike,
    profile: Profile,
    *,
    vae_from: str | os.PathLike | None = None,
    dit_init: str | os.PathLike | None = None,
    vae_only: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Runs both stages into `out`; returns (and writes to `recipe.json`) the run's summary.

    Writes `vae.safetensors` + `latent_stats.json` after stage 1, then `transformer.safetensors`
    and `text_encoder.safetensors` (bf16 EMA weights) at least every `checkpoint_seconds`
    during stage 2, `log.jsonl` throughout. `vae_from`: skip stage 1 and use the VAE (and its
    latent statistics) that an earlier run wrote to that folder (both are copied to `out`).
    `dit_init`: continue training the DiT and text encoder an earlier run wrote there
    (`train_dit_stage`); it needs `vae_from`, since its latents are that VAE's. `vae_only`:
    stop after stage 1.
    """
    if dit_init is not None and vae_from is None:
        raise ValueError("dit_init needs vae_from: the DiT was trained on that VAE's latents")
    if vae_only and (vae_from is not None or dit_init is not None):
        raise ValueError("vae_only trains the VAE stage alone: vae_from and dit_init skip it")
    fast_gpu_compiles()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log = log or (lambda line: print(f"[{time.perf_counter() - started:6.1f}s] {line}", flush=True))
    log_path = out / LOG_FILE
    log_path.write_text("")

    def write_log(record: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    log(f"profile {profile.name} on {jax.devices()[0].device_kind} (jax {jax.__version__})")
    summary: dict[str, Any] = {
        "profile": dataclasses.asdict(profile),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }
    deadline = None if profile.total_seconds is None else started + profile.total_seconds
    if vae_from is not None:
        vae = load_recipe_vae(vae_from, profile.spec.vae_preset())
        summary["vae"] = {"from": str(vae_from)}
        for name in (VAE_FILE, STATS_FILE):  # `out` stays one self-contained weights folder
            if Path(vae_from).resolve() != out.resolve():
                shutil.copyfile(Path(vae_from) / name, out / name)
        log(f"vae: using {vae_from}")
    else:
        if not vae_only:
            # Trace stage 2 with a stand-in VAE first: its errors surface before stage 1 runs.
            stand_in = wan_vae.WanVAE(wan_vae.PRESETS[profile.spec.vae_preset()], rngs=nnx.Rngs(0))
            train_dit_stage(profile, stand_in, out, log, write_log, check_only=True)
        vae, summary["vae"] = train_vae_stage(profile, out, log, write_log)
    if vae_only:
        return _finish(out, summary, started, log)
    if dit_init is not None:
        summary["dit_init"] = str(dit_init)
    trained = train_dit_stage(
        profile, vae, out, log, write_log, deadline=deadline, dit_init=dit_init
    )
    assert trained is not None  # None only for check_only
    summary["dit"] = trained[2]
    return _finish(out, summary, started, log)


def _finish(out: Path, summary: dict, started: float, log) -> dict:
    summary["seconds"] = round(time.perf_counter() - started, 1)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    log(f"done in {summary['seconds']}s: wrote {out}")
    return summary
