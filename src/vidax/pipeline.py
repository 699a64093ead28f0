"""Text -> latents -> frames, shared by every registered DiT.

    video = vidax.pipeline.generate("tiny", prompt="a red circle bouncing", seed=0)
    video.frames  # (F, H, W, 3) float32 in [0, 1]

All families go through `denoise`: one `jax.jit` around the whole sampler loop (`lax.fori_loop`),
classifier-free guidance batched into one forward per step. What differs between families is
confined to a small `Adapter` (how text embeddings become model keyword arguments, and how a latent
becomes the model input), so no family copies the loop.

The model knowledge it composes lives with the models: the registry (`vidax.models.registry`),
weights and their absence (`vidax.models.weights`: nothing runs on weights nobody asked for),
latent geometry (`ModelSpec.geometry`), each family's conditioning (`vidax.models.<family>`), and
prompt embeddings (`vidax.text`). Non-finite latents after sampling are an error naming the
first step that produced them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vidax import dvg, progress, sampling
from vidax.checkpoint import CheckpointError, write_atomic
from vidax.data import read_prompt
from vidax.models.dit_stages import VideoDiT
from vidax.models.experts import NUM_TRAIN_TIMESTEPS, TwoExperts
from vidax.models.lora import LoraLike, merge_loras
from vidax.models.registry import ModelSpec, get, names
from vidax.models.weights import (
    IMAGE_ENCODER,
    TEXT_ENCODER,
    TRANSFORMER,
    TRANSFORMER_2,
    VAE,
    load_image_encoder,
    load_text_encoder,
    load_transformer,
    load_transformer_2,
    load_vae,
    missing_message,
    missing_weights,
    random_image_encoder,
    random_text_encoder,
    random_transformer,
    resolve_spec,
    warn_random,
    with_vae,
)
from vidax.sampling import step_cache
from vidax.sampling.loop import VelocityFn
from vidax.sharding import auto_mesh, use_mesh
from vidax.text.prompts import PromptEmbeds, embed_prompts, fit_prompt_embeds
from vidax.video import image_pixels

Conditioning = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Video:
    """A generated clip: frames (F, H, W, 3) float32 in [0, 1] (b > 1: (b, F, H, W, 3); None
    without a VAE), latents (b, t, h, w, c) float32, the frame rate to write it at, and the
    initial noise (b, t, h, w, c) float32 the sampler started from (to compare against another
    implementation from the same start)."""

    frames: np.ndarray | None
    latents: np.ndarray
    fps: int
    noise: np.ndarray
    # With `accel`: DVG's decision per video (`vidax.dvg.Choice`: family, schedule, cost).
    choices: list | None = None
    # Wall-clock seconds of the denoising (compilation included), without the VAE decode.
    denoise_seconds: float | None = None
    # With accel "cache" / "dvg+cache": what the step cache did.
    step_cache: StepCacheReport | None = None


@dataclasses.dataclass(frozen=True)
class StepCacheReport:
    """What the step cache did in one `generate`: `skipped` of `steps` model forwards reused the
    previous step's output; `calibrating`: no calibration existed, so a full run made one
    (written to `calibration`) and, for accel="cache", is the result."""

    steps: int
    skipped: int
    calibration: Path
    calibrating: bool


# -- families -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Adapter:
    """What the shared loop needs to know about one DiT, from its family's package
    (`vidax.models.<family>`: `conditioning`, and optionally `embedded_guidance`).

    conditioning(text, guidance) -> keyword arguments of the model's forward;
    embedded_guidance: the model embeds the guidance scale (no CFG batch).
    Equal for equal (family, config).
    """

    family: ModuleType
    config: Any
    embedded_guidance: bool = False

    def conditioning(self, text: PromptEmbeds, guidance: float) -> Conditioning:
        return self.family.conditioning(self.config, text, guidance)

    @classmethod
    def of(cls, spec: ModelSpec) -> Adapter:
        family, config = spec.family_module, spec.config
        embedded = getattr(family, "embedded_guidance", None)
        return cls(family, config, embedded_guidance=bool(embedded and embedded(config)))


# -- denoising ------------------------------------------------------------------------------------


def denoise(
    model: nnx.Module,
    noise: jax.Array,
    cond: Conditioning,
    negative: Conditioning | None,
    *,
    solver,
    guidance: float,
    on_step: Callable[[int], None] | None = None,
) -> jax.Array:
    """Runs the full sampler loop (one jitted program; with `on_step`, one jitted step per call);
    returns the final latent (float32).

    Args:
      model: a DiT called as `model(x, timestep (b,), **cond)`.
      noise: (b, t, h, w, c) starting noise.
      cond / negative: conditioning pytrees with batch b (negative None disables CFG).
      solver: a `vidax.sampling` solver.
      guidance: classifier-free guidance scale (1 disables CFG).
      on_step: called on the host with i once step i has finished (progress bars); the loop
        then runs one compiled step per call instead of one program.

    Raises:
      ValueError: the latent turned non-finite (NaN or inf), naming the first step where it did.
    """
    latents, _ = _denoise(model, noise, cond, negative, solver, guidance, on_step)
    return latents


def denoise_cached(
    model: nnx.Module,
    noise: jax.Array,
    cond: Conditioning,
    negative: Conditioning | None,
    *,
    solver,
    guidance: float,
    skip: Sequence[bool],
    on_step: Callable[[int], None] | None = None,
) -> tuple[jax.Array, np.ndarray]:
    """`denoise` with a step cache: the steps `skip` marks reuse the previous step's model
    output (`vidax.sampling.step_cache`); all False is `denoise` exactly.

    Returns:
      (latents, changes): changes (num_steps,) the relative output change of each computed step
      from the one before (NaN where not measured), a calibration for `plan_skips`.
    """
    latents, changes = _denoise(
        model, noise, cond, negative, solver, guidance, on_step, tuple(skip)
    )
    assert changes is not None
    return latents, changes


def _denoise(model, noise, cond, negative, solver, guidance, on_step, skip=None):
    graphdef, state = nnx.split(model)
    negative = negative if negative is not None and guidance != 1.0 else None
    guidance = sampling.static_guidance(guidance)
    x = noise.astype(jnp.float32)
    if on_step is None:
        # The whole loop as one program; one scalar read after it: no per-step host sync.
        run = _compiled_loop(graphdef, solver, guidance, skip)
        latents, first_bad, changes = run(state, x, cond, negative)
    else:
        # From the host, one compiled step per call, `on_step(i)` once step i has finished:
        # a program with a host callback inside never goes to jax's persistent cache, so every
        # new process (each `vidax generate` with its progress bar) would compile it again.
        step_fn = _compiled_step(graphdef, solver, guidance, skip)
        carry = _compiled_init(solver, skip is not None)(x)
        for i in range(solver.num_steps):
            carry = jax.block_until_ready(step_fn(state, cond, negative, carry, i))
            on_step(i)
        latents, (_, first_bad), memory = carry
        changes = None if memory is None else memory[1]
    step = int(first_bad)
    if step >= 0:
        raise ValueError(
            f"sampling produced non-finite latents (NaN or inf) at denoising step {step + 1} of "
            f"{solver.num_steps}: check the weights, the prompt embeddings and the guidance scale"
        )
    return latents, None if changes is None else np.asarray(changes)


@dataclasses.dataclass(frozen=True)
class _WatchFinite:
    """A solver that also carries the first step whose output is not finite (-1: none yet).

    The check is one reduction over the latent per step, inside the compiled loop.
    """

    solver: Any

    @property
    def num_steps(self) -> int:
        return self.solver.num_steps

    @property
    def sigmas(self) -> np.ndarray:
        return self.solver.sigmas

    @property
    def timesteps(self) -> np.ndarray:
        return self.solver.timesteps

    def init(self, x):
        return self.solver.init(x), jnp.asarray(-1, jnp.int32)

    def step(self, state, i, x, v):
        inner, first_bad = state
        x, inner = self.solver.step(inner, i, x, v)
        bad = (first_bad < 0) & ~jnp.isfinite(x).all()
        return x, (inner, jnp.where(bad, jnp.asarray(i, jnp.int32), first_bad))


def _velocity(graphdef, state, cond, negative, guidance) -> VelocityFn:
    """The (guided, if `negative` is given) velocity of the model `graphdef` + `state`."""
    model = nnx.merge(graphdef, state)

    def model_fn(x, t, c):
        timestep = jnp.full((x.shape[0],), t, jnp.float32)
        return model(x, timestep, **c).astype(jnp.float32)

    if negative is not None:
        return sampling.classifier_free_guidance(model_fn, cond, negative, guidance)
    return lambda x, t: model_fn(x, t, cond)


# The compiled programs are cached on static values only (graphdef, solver, guidance, skips):
# nothing per call (a progress bar, a lambda) goes into their keys.


@functools.lru_cache(maxsize=16)
def _compiled_step(graphdef, solver, guidance, skip=None):
    """One step of the loop (step index traced); the carry is (x, solver state, the step
    cache's memory or None)."""
    watched = _WatchFinite(solver)
    reuse_at = None if skip is None else step_cache.reuse_mask(skip, 0, solver.num_steps)

    @jax.jit
    def step(state, cond, negative, carry, i):
        velocity = _velocity(graphdef, state, cond, negative, guidance)
        x, solver_state, memory = carry
        return sampling.carried_step(velocity, x, solver_state, memory, watched, reuse_at, i)

    return step


@functools.lru_cache(maxsize=16)
def _compiled_init(solver, cached: bool):
    watched = _WatchFinite(solver)

    def init(x):
        memory = step_cache.init_memory(x, solver.num_steps) if cached else None
        return x, watched.init(x), memory

    return jax.jit(init)


@functools.lru_cache(maxsize=16)
def _compiled_loop(graphdef, solver, guidance, skip=None):
    """The whole loop as one program: (latents, first non-finite step, the step cache's
    errors or None)."""

    @jax.jit
    def run(state, x, cond, negative):
        velocity = _velocity(graphdef, state, cond, negative, guidance)
        watched = _WatchFinite(solver)
        steps = dict(start=0, stop=solver.num_steps)
        if skip is None:
            x, (_, first_bad) = sampling.sample_steps(
                velocity, x, watched, watched.init(x), **steps
            )
            return x, first_bad, None
        x, (_, first_bad), changes = step_cache.cached_steps(
            velocity, x, watched, watched.init(x), skip, **steps
        )
        return x, first_bad, changes

    return run


def decode(vae, latents: jax.Array) -> np.ndarray:
    """VAE-decodes (b, t, h, w, c) latents to (b, F, H, W, 3) float32 frames in [0, 1]."""
    graphdef, state = nnx.split(vae)
    pixels = _compiled_decode(graphdef)(state, latents)
    return np.asarray((jnp.clip(pixels, -1.0, 1.0) + 1.0) / 2.0, np.float32)


@functools.lru_cache(maxsize=4)
def _compiled_decode(graphdef):
    return jax.jit(lambda state, z: nnx.merge(graphdef, state).decode(z))


# -- image-to-video -------------------------------------------------------------------------------


def _check_task(spec: ModelSpec, image, guidance_2: float | None) -> None:
    """What the spec generates from must fit what was given (`ModelSpec.task`)."""
    if image is not None and spec.task == "t2v":
        raise ValueError(
            f"model {spec.name!r} is text-to-video: it takes no image (image-to-video presets: "
            f"{', '.join(n for n in names(causal=False) if get(n).task != 't2v')})"
        )
    if image is None and spec.task == "i2v":
        raise ValueError(f"model {spec.name!r} is image-to-video: pass an image (--image FILE)")
    if guidance_2 is not None and spec.boundary_ratio is None:
        raise ValueError(
            f"guidance_2 is the low-noise expert's scale; model {spec.name!r} has one transformer"
        )


def image_conditioning(
    spec: ModelSpec,
    image: np.ndarray,
    vae,
    image_encoder,
    num_frames: int,
    height: int,
    width: int,
    batch: int,
) -> Conditioning:
    """The forward's image-to-video arguments for a first frame, by the spec's family:
    `condition` (b, t, h, w, k) on the latent grid (`vidax.models.<family>.image_condition`)
    and the image encoder's tokens where the model reads them (the encoder's own
    `preprocess` of the image, or of the first frame at the video size where the family's
    `ENCODER_SEES_FIRST_FRAME`; its output the family's `image_tokens`; `image_inputs`).

    Raises:
      ValueError: no VAE to encode the image, or an image batch that is neither 1 nor `batch`.
    """
    family = spec.family_module
    if vae is None:
        raise ValueError(f"model {spec.name!r} has no VAE to encode the image with")
    frames = image_pixels(image, height, width)
    if frames.shape[0] not in (1, batch):
        raise ValueError(f"{frames.shape[0]} images for {batch} prompts: pass 1 or {batch}")
    pixels = np.broadcast_to(frames, (batch, *frames.shape[1:]))
    graphdef, state = nnx.split(vae)
    encode = functools.partial(_compiled_encode(graphdef), state)
    latent_frames = spec.geometry().latent_shape(num_frames, height, width)[0]
    condition = family.image_condition(
        spec.config, encode, jnp.asarray(pixels), num_frames, latent_frames
    )
    tokens = None
    if image_encoder is not None:
        if family.ENCODER_SEES_FIRST_FRAME:  # the image at the video size, as the VAE sees it
            shown = np.round((frames + 1.0) * 127.5).astype(np.uint8)
        else:
            shown = np.asarray(image)
            shown = shown[None] if shown.ndim == 3 else shown
        encoder_pixels = image_encoder.preprocess(shown)
        graphdef, state = nnx.split(image_encoder)
        read = _compiled_image_tokens(graphdef, family, spec.config)
        tokens = read(state, jnp.asarray(encoder_pixels))
        tokens = jnp.broadcast_to(tokens, (batch, *tokens.shape[1:]))
    return {"condition": condition, **family.image_inputs(spec.config, tokens)}


@functools.lru_cache(maxsize=4)
def _compiled_encode(graphdef):
    return jax.jit(lambda state, video: nnx.merge(graphdef, state).encode(video))


@functools.lru_cache(maxsize=4)
def _compiled_image_tokens(graphdef, family: ModuleType, config):
    # Which of the encoder's outputs the DiT reads is its family's `image_tokens`.
    return jax.jit(
        lambda state, pixels: family.image_tokens(config, nnx.merge(graphdef, state), pixels)
    )


# -- the user-facing call -------------------------------------------------------------------------


def generate(
    model: str | ModelSpec | None,
    prompt: str | list[str] | None = None,
    *,
    prompt_embeds: PromptEmbeds | jax.Array | np.ndarray | None = None,
    negative_prompt: str = "",
    negative_prompt_embeds: PromptEmbeds | jax.Array | np.ndarray | None = None,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    shift: float | None = None,
    sampler: str | None = None,
    seed: int = 0,
    checkpoint: str | os.PathLike | None = None,
    transformer: VideoDiT | TwoExperts | None = None,
    vae=None,
    text_encoder: nnx.Module | str | os.PathLike | None = None,
    decode_frames: bool = True,
    mesh: Mesh | None = None,
    strategy: str | None = None,
    on_step: Callable[[int], None] | None = None,
    accel: str = "none",
    budget: float | None = None,
    random_weights: bool = False,
    lora: Sequence[LoraLike] = (),
    image: np.ndarray | None = None,
    guidance_2: float | None = None,
    image_encoder: nnx.Module | None = None,
) -> Video:
    """Generates a video from a prompt or precomputed embeddings (and, image-to-video, its first
    frame).

    Args:
      model: preset name or `ModelSpec`. With a `checkpoint` that has its own configs (a
        diffusers pipeline or transformer folder) a name (or None) is only the default for what
        the checkpoint does not say (`vidax.models.pretrained.spec_from_checkpoint`); a
        `ModelSpec` is used as it is.
      prompt / prompt_embeds: exactly one; embeddings are `PromptEmbeds` or arrays
        (b, s, text_dim) / (s, text_dim).
      negative_prompt / negative_prompt_embeds: the CFG unconditional branch.
      num_frames, height, width: pixel video size (checked against the VAE and patch).
      steps, guidance, shift, sampler: sampling settings (default: the preset's).
      seed: noise seed.
      checkpoint: diffusers-layout pipeline folder or transformer weights (default: shipped).
      transformer / vae: already-built models (skip loading); vae may also be a path (a
        diffusers VAE folder, or a pipeline folder with vae/) that replaces the model's VAE.
      text_encoder: the text encoder instead of the checkpoint's or shipped one: a built
        `WordEncoder`, or a path (umT5: a pipeline folder or a text_encoder/ folder with its
        tokenizer beside or inside it; `WordEncoder`: its .safetensors file or folder).
      decode_frames: decode latents to frames with the VAE.
      mesh / strategy: run sharded over `mesh` with a `vidax.sharding` strategy.
      on_step: host callback with the index of each finished denoising step; a run of several
        passes (dvg+cache calibrating first) reports them as one run (`vidax.progress.share`).
      accel: progressive sampling (`vidax.dvg.accelerate`): "dvg" (content-aware), "spatial",
        "temporal", "joint"; "cache": a step cache (`vidax.sampling.step_cache`: forwards whose
        output barely changes reuse the previous one, planned from this model's calibration,
        which a first full run makes and keeps in $VIDAX_STEP_CACHE_DIR or
        ~/.cache/vidax/step_cache); "dvg+cache": DVG with the step cache in its stages; or
        "none" (this module's sampler). `Video.step_cache` says what the cache did.
      budget: for DVG, the fraction of full-sampling token-steps to spend (default
        `vidax.dvg.DEFAULT_BUDGET`); for "cache", the fraction of model forwards to run
        (default `step_cache.DEFAULT_KEEP`, which "dvg+cache" uses for its cache).
      random_weights: run the parts that have no weights (transformer, VAE, trained text
        encoder) on random initialisation, with one `RandomWeightsWarning`; without it, missing
        weights are a `CheckpointError` naming every missing part.
      lora: LoRA files merged into the transformer this call loads (`LoraSpec`, a path, or
        "FILE[:SCALE]"); into a given `transformer`, merge once with
        `vidax.models.lora.merge_loras` instead.
      image: the first frame, (H, W, 3) or (b, H, W, 3), uint8 or floats in [0, 1]: required
        by image-to-video presets (`spec.task` "i2v"), optional for "ti2v", refused by
        text-to-video ones. Resized to the video size; encoded by the VAE (and, for Wan 2.1
        I2V and HunyuanVideo-1.5 I2V, the CLIP / SigLIP image encoder) into the model's
        condition.
      guidance_2: two-expert models (Wan 2.2 A14B): the low-noise expert's guidance scale
        (default: the preset's `guidance_2`, else `guidance`).
      image_encoder: an already-built image encoder (skip loading it).

    Raises:
      CheckpointError: missing weights (see random_weights), a checkpoint or LoRA that does not
        fit.
      ValueError: bad settings, or non-finite latents after sampling (naming the step).
    """
    spec = resolve_spec(model, checkpoint)
    if isinstance(vae, str | os.PathLike):
        spec = with_vae(spec, vae)
        vae = None
    family = Adapter.of(spec)
    if mesh is not None:
        mesh = auto_mesh(mesh)
    d = spec.defaults
    num_frames = d.num_frames if num_frames is None else num_frames
    height, width = d.height if height is None else height, d.width if width is None else width
    steps = d.steps if steps is None else steps
    guidance = d.guidance if guidance is None else guidance
    shift = d.shift if shift is None else shift
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    geometry = spec.geometry()
    shape = geometry.latent_shape(num_frames, height, width)
    _check_task(spec, image, guidance_2)

    if (prompt is None) == (prompt_embeds is None):
        raise ValueError("pass exactly one of prompt and prompt_embeds")
    if lora and spec.boundary_ratio is not None:
        raise ValueError(
            f"model {spec.name!r} has two experts: LoRA merging into them is not supported yet"
        )
    if lora and transformer is not None:  # merging on every call would stack the LoRA
        raise ValueError(
            "lora= merges into the transformer generate loads; into a given one, merge once "
            "with vidax.models.lora.merge_loras(transformer, spec, lora)"
        )
    # Every missing part is named at once, before anything loads.
    missing = missing_weights(
        spec,
        checkpoint,
        transformer=transformer is None,
        vae=(decode_frames or image is not None) and vae is None,
        text_encoder=prompt is not None and text_encoder is None,
        image_encoder=image is not None and image_encoder is None,
    )
    if missing and not random_weights:
        raise CheckpointError(missing_message(spec, missing))
    if TEXT_ENCODER in missing and spec.text_config is None:  # umT5, LLaVA: no random stand-in
        raise CheckpointError(missing_message(spec, [TEXT_ENCODER]))
    if missing:
        warn_random(spec, missing)
    if TEXT_ENCODER in missing and spec.text_config is not None:
        text_encoder = random_text_encoder(spec)
    if prompt is not None:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        prompts = [read_prompt(spec, p) for p in prompts]  # a shapes model's caption grammar
        text = embed_prompts(spec, prompts, checkpoint, text_encoder=text_encoder)
        neg_text = embed_prompts(
            spec, [negative_prompt] * len(prompts), checkpoint, text_encoder=text_encoder
        )
    else:
        text = fit_prompt_embeds(spec, prompt_embeds)
        if negative_prompt_embeds is not None:
            neg_text = fit_prompt_embeds(spec, negative_prompt_embeds)
        else:  # an empty negative prompt is all padding
            neg_text = text.empty()
        if neg_text.batch != text.batch:
            neg_text = jax.tree.map(
                lambda a: jnp.broadcast_to(a[:1], (text.batch, *a.shape[1:])), neg_text
            )
    cond = family.conditioning(text, guidance)
    negative = None if family.embedded_guidance else family.conditioning(neg_text, guidance)
    cfg_scale: float | sampling.ExpertGuidance = 1.0 if family.embedded_guidance else guidance
    if spec.boundary_ratio is not None and not family.embedded_guidance:
        low = guidance_2 if guidance_2 is not None else d.guidance_2
        cfg_scale = sampling.ExpertGuidance(
            guidance, guidance if low is None else low, spec.boundary_ratio * NUM_TRAIN_TIMESTEPS
        )

    solver = d.solver(sampler=sampler, steps=steps, shift=shift)
    noise = jax.random.normal(jax.random.key(seed), (text.batch, *shape), jnp.float32)
    initial_noise = np.asarray(noise)  # host copy: `Video.noise`
    if transformer is None:
        if TRANSFORMER in missing:
            transformer = random_transformer(spec, mesh, strategy)
        else:
            transformer = load_transformer(spec, checkpoint, mesh=mesh, strategy=strategy)
        if lora:
            merge_loras(transformer, spec, lora)
        if spec.boundary_ratio is not None:
            second: VideoDiT | None = (
                random_transformer(spec, mesh, strategy, seed=1)  # (warned above)
                if TRANSFORMER_2 in missing
                else load_transformer_2(spec, checkpoint, mesh=mesh, strategy=strategy)
            )
            assert second is not None and isinstance(transformer, VideoDiT)
            transformer = TwoExperts(transformer, second, spec.boundary_ratio)
    if vae is None and (decode_frames or image is not None):
        if VAE in missing and spec.vae_spec is not None:
            vae = spec.vae_spec.build(seed=0)
        else:
            vae = load_vae(spec, checkpoint)
    condition = None
    if image is not None:
        if image_encoder is None and IMAGE_ENCODER in missing:
            image_encoder = random_image_encoder(spec)  # (warned above)
        elif image_encoder is None:
            image_encoder = load_image_encoder(spec, checkpoint)
        extra = image_conditioning(
            spec, image, vae, image_encoder, num_frames, height, width, text.batch
        )
        condition = extra["condition"]
        cond = {**cond, **extra}
        negative = None if negative is None else {**negative, **extra}
    if accel not in ACCEL_MODES:
        raise ValueError(f"accel must be one of {', '.join(ACCEL_MODES)}, got {accel!r}")
    progressive = accel.removesuffix("+cache") if accel != "cache" else "none"
    sampler_kw = dict(solver=solver, guidance=cfg_scale, on_step=on_step)
    mesh_context: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if mesh is not None:
        batch_axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
        noise = jax.device_put(noise, NamedSharding(mesh, PartitionSpec(batch_axes or None)))
        mesh_context = use_mesh(mesh, strategy or "fsdp")
    choices: list = []
    cache: StepCacheReport | None = None
    latents = None
    started = time.perf_counter()
    with mesh_context:
        skip = None
        if accel in ("cache", "dvg+cache"):
            # The skip plan comes from this model's calibration; without one, a full run
            # calibrates first (for accel="cache" it is also the answer).
            path = _calibration_path(spec, checkpoint, solver, shape, cfg_scale)
            changes = _read_calibration(path)
            calibrating = changes is None
            if changes is None:
                passes = 2 if accel == "dvg+cache" else 1  # calibrate, then DVG's run
                latents, changes = denoise_cached(
                    transformer,
                    noise,
                    cond,
                    negative,
                    skip=(False,) * steps,
                    **{**sampler_kw, "on_step": progress.share(on_step, steps, 0, passes)},
                )
                _write_calibration(path, changes)
                if passes == 2:
                    sampler_kw["on_step"] = progress.share(on_step, steps, 1, passes)
            if accel == "dvg+cache" or not calibrating:
                keep = budget if accel == "cache" and budget is not None else None
                skip = step_cache.plan_skips(
                    changes, keep or step_cache.DEFAULT_KEEP, warn=keep is not None
                )
            skipped = 0 if skip is None else sum(skip)
            cache = StepCacheReport(steps, skipped, path, calibrating)
            if accel == "cache" and skip is not None:
                latents, _ = denoise_cached(
                    transformer, noise, cond, negative, skip=skip, **sampler_kw
                )
        if progressive != "none":
            latents, choices = dvg.accelerate(
                transformer,
                noise,
                cond,
                negative,
                accel=progressive,
                budget=dvg.DEFAULT_BUDGET if budget is None else budget,
                policy=dvg.Policy(spatial=spec.dvg_spatial),
                skip=skip,
                **sampler_kw,
            )
        elif latents is None:
            latents = denoise(transformer, noise, cond, negative, **sampler_kw)
        latents = jax.block_until_ready(latents)
    denoise_seconds = time.perf_counter() - started
    if not np.isfinite(np.asarray(latents)).all():  # `denoise` names the step; dvg cannot
        raise ValueError(f"sampling (--accel {accel}) produced non-finite latents (NaN or inf)")
    conditioned = getattr(spec.family_module, "conditioned_output", None)
    if condition is not None and conditioned is not None:
        latents = conditioned(spec.config, latents, condition)

    frames = None
    if decode_frames and vae is not None:
        frames = decode(vae, latents)
        frames = frames[0] if frames.shape[0] == 1 else frames
    return Video(
        frames=frames,
        latents=np.asarray(latents),
        fps=d.fps,
        noise=initial_noise,
        choices=choices or None,
        denoise_seconds=denoise_seconds,
        step_cache=cache,
    )


@dataclasses.dataclass
class Loaded:
    """A model loaded once to generate many videos: its spec and its built parts.

    text_encoder is a built `WordEncoder`, a path given to `load`, or None (the checkpoint's
    own umT5, read on first use, or the built-in hashed embedder).
    """

    spec: ModelSpec
    transformer: VideoDiT | TwoExperts
    vae: nnx.Module | None
    text_encoder: nnx.Module | str | os.PathLike | None
    checkpoint: Path | None
    image_encoder: nnx.Module | None = None

    def generate(self, prompt: str | list[str] | None = None, **kwargs) -> Video:
        """`generate` with this model's parts (keyword arguments as there)."""
        return generate(
            self.spec,
            prompt,
            transformer=self.transformer,
            vae=self.vae,
            text_encoder=self.text_encoder,
            checkpoint=self.checkpoint,
            image_encoder=self.image_encoder,
            **kwargs,
        )


def load(
    checkpoint: str | os.PathLike | None = None,
    model: str | ModelSpec | None = None,
    *,
    vae: str | os.PathLike | None = None,
    text_encoder: str | os.PathLike | None = None,
    mesh: Mesh | None = None,
    strategy: str | None = None,
    random_weights: bool = False,
    lora: Sequence[LoraLike] = (),
) -> Loaded:
    """Builds a model from a diffusers checkpoint's configs (or a preset) and loads its weights.

    Args:
      checkpoint: a diffusers pipeline folder (`model_index.json`), a transformer folder, or
        weights for `model`'s config; None: the preset's shipped weights.
      model: preset name (the default for what the checkpoint does not say) or `ModelSpec`.
      vae / text_encoder: paths replacing one component (see `generate`).
      mesh / strategy: place the transformer's parameters sharded.
      random_weights: parts without weights run on random initialisation (warning).
      lora: LoRA files merged into the transformer (`LoraSpec`, a path, or "FILE[:SCALE]").

    Raises:
      CheckpointError: missing weights or configs, or a checkpoint that does not fit.
      ValueError: a checkpoint vidax does not run, or one of another family than `model`.
    """
    spec = resolve_spec(
        model if model is not None or checkpoint is not None else "tiny", checkpoint
    )
    if vae is not None:
        spec = with_vae(spec, vae)
    if mesh is not None:
        mesh = auto_mesh(mesh)
    missing = missing_weights(
        spec, checkpoint, text_encoder=text_encoder is None, image_encoder=True
    )
    if missing and not random_weights:
        raise CheckpointError(missing_message(spec, missing))
    if lora and spec.boundary_ratio is not None:
        raise ValueError(
            f"model {spec.name!r} has two experts: LoRA merging into them is not supported yet"
        )
    first = load_transformer(
        spec, checkpoint, mesh=mesh, strategy=strategy, random_weights=random_weights
    )
    if lora:
        merge_loras(first, spec, lora)
    second = load_transformer_2(
        spec, checkpoint, mesh=mesh, strategy=strategy, random_weights=random_weights
    )
    transformer: VideoDiT | TwoExperts = first
    if second is not None and spec.boundary_ratio is not None:
        transformer = TwoExperts(first, second, spec.boundary_ratio)
    loaded_vae = load_vae(spec, checkpoint, random_weights=random_weights)
    encoder: nnx.Module | str | os.PathLike | None = text_encoder
    if encoder is None and spec.text_config is not None:
        encoder = load_text_encoder(spec, checkpoint, random_weights=random_weights)
    return Loaded(
        spec=spec,
        transformer=transformer,
        vae=loaded_vae,
        text_encoder=encoder,
        checkpoint=None if checkpoint is None else Path(checkpoint),
        image_encoder=load_image_encoder(spec, checkpoint, random_weights=random_weights),
    )


# `generate(accel=...)`: DVG's progressive modes, the step cache, and DVG with the step cache.
ACCEL_MODES = (*dvg.ACCEL_MODES, "cache", "dvg+cache")
ENV_STEP_CACHE = "VIDAX_STEP_CACHE_DIR"


def _calibration_path(
    spec: ModelSpec, checkpoint, solver, shape, guidance: float | sampling.ExpertGuidance
) -> Path:
    """Where the step-cache calibration of this model, weights, schedule, size and guidance is
    kept: $VIDAX_STEP_CACHE_DIR, else $XDG_CACHE_HOME/vidax/step_cache (~/.cache/...)."""
    key = repr(
        (
            spec.name,
            spec.config,
            None if checkpoint is None else str(Path(checkpoint).resolve()),
            type(solver).__name__,
            np.round(np.asarray(solver.sigmas, np.float64), 6).tolist(),
            tuple(shape),
            repr(sampling.static_guidance(guidance)),
        )
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    given = os.environ.get(ENV_STEP_CACHE)
    if given is not None:
        root = Path(given)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vidax"
        root = root / "step_cache"
    return root / f"{spec.name}-{digest}.json"


def _read_calibration(path: Path) -> np.ndarray | None:
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text())["changes"]
        return np.asarray([np.nan if v is None else v for v in values], np.float64)
    except (ValueError, KeyError, TypeError):  # unreadable: calibrate again
        return None


def _write_calibration(path: Path, changes: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    values = [None if not np.isfinite(c) else float(c) for c in changes]
    write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps({"changes": values}) + "\n"))
