"""Text -> latents -> frames, shared by every registered DiT.

    video = vidax.pipeline.generate("tiny", prompt="a red circle bouncing", seed=0)
    video.frames  # (F, H, W, 3) float32 in [0, 1]

All families go through `denoise`: one `jax.jit` around the whole sampler loop (`lax.fori_loop`),
classifier-free guidance batched into one forward per step. What differs between families is
confined to a small `Adapter` (how text embeddings become model keyword arguments, and how a latent
becomes the model input), so no family copies the loop.

Nothing runs on weights nobody asked for: a part without weights (in the checkpoint or shipped)
is an error naming it, unless `random_weights=True` (`--random-weights`) asks for random
initialisation, which then warns once (`RandomWeightsWarning`). Non-finite latents after sampling
are an error naming the first step that produced them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vidax import sampling
from vidax.checkpoint import CheckpointError
from vidax.models import pretrained
from vidax.models.registry import ModelSpec, get

Conditioning = dict[str, Any]
ASSETS = Path(__file__).parent / "assets"


@dataclasses.dataclass(frozen=True)
class Video:
    """A generated clip: frames (F, H, W, 3) float32 in [0, 1] (b > 1: (b, F, H, W, 3); None
    without a VAE), latents (b, t, h, w, c) float32, the frame rate to write it at, and the
    initial noise (b, t, h, w, c) float32 the sampler started from (to compare against another
    implementation from the same start)."""

    frames: np.ndarray | None
    latents: np.ndarray
    fps: int
    noise: np.ndarray | None = None
    # With `accel`: DVG's decision per video (`vidax.dvg.Choice`: family, schedule, cost).
    choices: list | None = None
    # Wall-clock seconds of the denoising (compilation included), without the VAE decode.
    denoise_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    """Text conditioning before it is shaped for a family.

    embeds: (b, s, d) token embeddings, zero past each prompt's end; mask: (b, s) bool;
    pooled: (b, p) pooled embedding for families that use one (HunyuanVideo), else None.
    """

    embeds: jax.Array
    mask: jax.Array
    pooled: jax.Array | None = None

    @property
    def batch(self) -> int:
        return self.embeds.shape[0]


# -- latent geometry ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentGeometry:
    """How pixel video sizes map to latent sizes (VAE strides, DiT patch)."""

    temporal_stride: int
    spatial_stride: int
    patch: tuple[int, int, int]
    channels: int

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(t, h, w, c) of the latent for a video; raises a clear ValueError when impossible."""
        ts, ss = self.temporal_stride, self.spatial_stride
        if num_frames < 1 or (num_frames - 1) % ts:
            raise ValueError(f"num_frames must be {ts}k+1 (e.g. {ts * 4 + 1}), got {num_frames}")
        t = 1 + (num_frames - 1) // ts
        if t % self.patch[0]:
            raise ValueError(
                f"{t} latent frames are not divisible by the temporal patch {self.patch[0]}"
            )
        unit = ss * max(self.patch[1], self.patch[2])
        if height % unit or width % unit or height < unit or width < unit:
            raise ValueError(
                f"height and width must be positive multiples of {unit}, got {height}x{width}"
            )
        return t, height // ss, width // ss, self.channels


def latent_channels(spec: ModelSpec) -> int:
    """Channels of the latent being denoised (inputs may add condition channels)."""
    return getattr(spec.config, "latent_channels", spec.config.in_channels)


def geometry(spec: ModelSpec) -> LatentGeometry:
    """The latent geometry of a preset (its VAE's strides, or 4x8x8 without a VAE)."""
    temporal, spatial = 4, 8
    channels = latent_channels(spec)
    if spec.vae is not None:
        vae = spec.vae_spec.config
        temporal, spatial = vae.temporal_factor, vae.spatial_factor
        if vae.z_dim != channels:
            raise ValueError(
                f"model {spec.name!r}: VAE {spec.vae_name!r} has {vae.z_dim} latent channels "
                f"but the transformer denoises {channels}"
            )
    return LatentGeometry(
        temporal_stride=temporal,
        spatial_stride=spatial,
        patch=tuple(spec.config.patch_size),
        channels=channels,
    )


# -- families -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Adapter:
    """What the shared loop needs to know about one DiT family.

    conditioning(spec, text, guidance) -> keyword arguments of the model's forward;
    model_input(spec, x) -> the model's input for latent x (e.g. extra condition channels);
    embedded_guidance: the family embeds the guidance scale (no CFG batch).
    """

    conditioning: Callable[[ModelSpec, PromptEmbeds, float], Conditioning]
    model_input: Callable[[ModelSpec, jax.Array], jax.Array] = lambda spec, x: x
    embedded_guidance: Callable[[ModelSpec], bool] = lambda spec: False


def _wan_conditioning(spec, text: PromptEmbeds, guidance) -> Conditioning:
    del spec, guidance  # Wan attends to zero-padded text without a mask
    return {"context": text.embeds * text.mask[..., None].astype(text.embeds.dtype)}


def _hunyuan_conditioning(spec, text: PromptEmbeds, guidance) -> Conditioning:
    c = spec.config
    pooled = text.pooled
    if pooled is None:
        pooled = jnp.zeros((text.batch, c.pooled_dim), jnp.float32)
    cond = {"text": text.embeds, "text_mask": text.mask, "pooled": pooled}
    if c.guidance_embeds:  # guidance-distilled: the scale (x1000) is an input, not a CFG batch
        cond["guidance"] = jnp.full((text.batch,), 1000.0 * guidance, jnp.float32)
    return cond


def _hunyuan15_conditioning(spec, text: PromptEmbeds, guidance) -> Conditioning:
    del spec, guidance
    return {"text": text.embeds, "text_mask": text.mask}


def _hunyuan15_input(spec, x):
    # Text-to-video: the condition latent and its mask channel are zeros (diffusers
    # `prepare_cond_latents_and_mask`).
    extra = spec.config.in_channels - x.shape[-1]
    return jnp.concatenate([x, jnp.zeros((*x.shape[:-1], extra), x.dtype)], axis=-1)


ADAPTERS: dict[str, Adapter] = {
    "wan": Adapter(_wan_conditioning),
    "hunyuanvideo": Adapter(
        _hunyuan_conditioning, embedded_guidance=lambda spec: spec.config.guidance_embeds
    ),
    "hunyuanvideo15": Adapter(_hunyuan15_conditioning, model_input=_hunyuan15_input),
}


def adapter(spec: ModelSpec) -> Adapter:
    try:
        return ADAPTERS[spec.family]
    except KeyError:
        raise ValueError(f"no pipeline adapter for family {spec.family!r}") from None


# -- text -----------------------------------------------------------------------------------------


def embed_prompts(
    spec: ModelSpec,
    prompts: list[str],
    checkpoint: str | os.PathLike | None = None,
    *,
    text_encoder=None,
    random_weights: bool = False,
) -> PromptEmbeds:
    """Prompt embeddings with the spec's text encoder.

    "hashed" presets use the built-in embedder, then (where `spec.text_config` is set) the
    trained `WordEncoder`: `text_encoder` if given, else `load_text_encoder` (with
    `random_weights`). Wan presets use umT5 when `checkpoint` is a diffusers pipeline folder
    with `text_encoder/` and `tokenizer/`.
    Other encoders (LLaVA, Qwen) are not ported: pass precomputed embeddings
    (`load_prompt_embeds`).
    """
    c = spec.config
    if spec.text_encoder == "hashed":
        from vidax.text.hashed import HashedTextEmbedder

        if spec.text_config is not None:
            t = spec.text_config
            words, mask = HashedTextEmbedder(dim=t.in_dim, text_len=t.text_len)(prompts)
            if isinstance(text_encoder, str | os.PathLike):
                text_encoder = _cached_text_encoder(str(_word_encoder_file(text_encoder)), t)
            encoder = text_encoder or load_text_encoder(
                spec, checkpoint, random_weights=random_weights
            )
            embeds = _compiled_text(nnx.graphdef(encoder))(
                nnx.state(encoder), jnp.asarray(words), jnp.asarray(mask)
            )
            return PromptEmbeds(embeds, jnp.asarray(mask), None)
        embeds, mask = HashedTextEmbedder(dim=c.text_dim, text_len=c.text_len)(prompts)
        pooled = None
        pooled_dim = getattr(c, "pooled_dim", None)
        if pooled_dim is not None:  # a pooled vector: mean of the words' embeddings
            words, wmask = HashedTextEmbedder(dim=pooled_dim, text_len=c.text_len)(prompts)
            count = np.maximum(wmask.sum(1, keepdims=True), 1)
            pooled = jnp.asarray((words * wmask[..., None]).sum(1) / count, jnp.float32)
        return PromptEmbeds(jnp.asarray(embeds), jnp.asarray(mask), pooled)
    source = text_encoder if isinstance(text_encoder, str | os.PathLike) else checkpoint
    if spec.text_encoder.startswith("umt5") and source is not None:
        folders = _umt5_folders(Path(source))
        if folders is not None:
            return _umt5_embeds(spec, prompts, *folders)
    raise ValueError(
        f"model {spec.name!r} needs its text encoder ({spec.text_encoder}): pass a diffusers "
        "pipeline folder with text_encoder/ and tokenizer/ (umT5 only) or precomputed prompt "
        "embeddings (--prompt-embeds)"
    )


TEXT_ENCODER_FILE = "text_encoder.safetensors"


def load_text_encoder(
    spec: ModelSpec, checkpoint: str | os.PathLike | None = None, *, random_weights: bool = False
):
    """The spec's trained `WordEncoder`: `<checkpoint>/text_encoder.safetensors` (a weights
    folder), else the shipped one, else (only with `random_weights`, warning) random weights.

    Raises:
      CheckpointError: no weights and not `random_weights`.
    """
    if spec.text_config is None:
        raise ValueError(f"model {spec.name!r} has no trained text encoder")
    path = _text_encoder_path(spec, checkpoint)
    if path is not None:
        return _cached_text_encoder(str(path), spec.text_config)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [TEXT_ENCODER]))
    _warn_random(spec, [TEXT_ENCODER])
    return _random_text_encoder(spec)


def _text_encoder_path(spec: ModelSpec, checkpoint) -> Path | None:
    if checkpoint is not None and (Path(checkpoint) / TEXT_ENCODER_FILE).is_file():
        return Path(checkpoint) / TEXT_ENCODER_FILE
    return _shipped(spec, TEXT_ENCODER_FILE)


def _random_text_encoder(spec: ModelSpec):
    from vidax.text import encoder as word_encoder

    return word_encoder.WordEncoder(spec.text_config, rngs=nnx.Rngs(0))


@functools.lru_cache(maxsize=2)
def _cached_text_encoder(path: str, config):
    from vidax.text import encoder as word_encoder

    return word_encoder.load(path, config)


@functools.lru_cache(maxsize=4)
def _compiled_text(graphdef):
    return jax.jit(lambda state, words, mask: nnx.merge(graphdef, state)(words, mask))


def _word_encoder_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / TEXT_ENCODER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"text encoder weights not found: {path}")
    return path


def _umt5_folders(path: Path) -> tuple[Path, Path] | None:
    """(text encoder folder, tokenizer folder) of a pipeline folder or of a text_encoder folder
    with its tokenizer inside or beside it; None if `path` holds no text encoder."""
    if (path / "text_encoder").is_dir():
        return path / "text_encoder", path / "tokenizer"
    if (path / "config.json").is_file():
        inside = any((path / f).is_file() for f in ("tokenizer.json", "spiece.model"))
        return path, path if inside else path.parent / "tokenizer"
    return None


def _umt5_embeds(
    spec: ModelSpec, prompts: list[str], encoder_dir: Path, tokenizer_dir: Path
) -> PromptEmbeds:
    from vidax.models import umt5
    from vidax.text import encode_prompts_with_lengths

    config_file = encoder_dir / "config.json"
    if config_file.exists():
        config = umt5.from_hf_config(json.loads(config_file.read_text()), dtype="float32")
    else:
        config = umt5.PRESETS[spec.text_encoder]
    if config.d_model != spec.config.text_dim:
        raise ValueError(
            f"text encoder width {config.d_model} != transformer text_dim {spec.config.text_dim}"
        )
    encoder = _cached_umt5(str(encoder_dir), config)
    tokenizer = umt5.Tokenizer(tokenizer_dir)
    embeds, lengths = encode_prompts_with_lengths(
        encoder, tokenizer, prompts, max_length=spec.config.text_len
    )
    mask = np.arange(spec.config.text_len)[None] < lengths[:, None]
    return PromptEmbeds(jnp.asarray(embeds), jnp.asarray(mask))


@functools.lru_cache(maxsize=2)
def _cached_umt5(path: str, config):
    from vidax.models import umt5

    return umt5.load(path, config)


def load_prompt_embeds(
    path: str | os.PathLike, spec: ModelSpec
) -> tuple[PromptEmbeds, PromptEmbeds | None]:
    """Reads precomputed prompt embeddings, fitted to the model's text length.

    `.npy`: (b, s, d) or (s, d) embeddings. `.safetensors`: `prompt_embeds` and optionally
    `prompt_mask`, `pooled_prompt_embeds` and the same with a `negative_` prefix.

    Returns (prompt, negative prompt or None).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt embeddings not found: {path}")
    if path.suffix == ".npy":
        arrays = {"prompt_embeds": np.load(path)}
    elif path.suffix == ".safetensors":
        from vidax.checkpoint import open_checkpoint

        reader = open_checkpoint(path)
        if "prompt_embeds" not in reader:
            raise ValueError(f"{path}: expected a 'prompt_embeds' tensor, found {sorted(reader)}")
        arrays = {k: np.asarray(reader[k]) for k in reader}
    else:
        raise ValueError(f"{path}: prompt embeddings must be .npy or .safetensors")

    def read(prefix: str) -> PromptEmbeds | None:
        if f"{prefix}prompt_embeds" not in arrays:
            return None
        return fit_prompt_embeds(
            spec,
            arrays[f"{prefix}prompt_embeds"],
            arrays.get(f"{prefix}prompt_mask"),
            arrays.get(f"{prefix}pooled_prompt_embeds"),
            source=str(path),
        )

    return read(""), read("negative_")


def fit_prompt_embeds(
    spec: ModelSpec, embeds, mask=None, pooled=None, *, source: str = "prompt_embeds"
) -> PromptEmbeds:
    """Validates (b, s, d) or (s, d) embeddings and pads/truncates them to `text_len`.

    Without a mask, rows that are entirely zero count as padding.
    """
    c = spec.config
    x = np.asarray(embeds, np.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != c.text_dim:
        raise ValueError(f"{source}: prompt embeddings must be (b, s, {c.text_dim}), got {x.shape}")
    m = (
        np.any(x != 0, axis=-1)
        if mask is None
        else np.asarray(mask).astype(bool).reshape(x.shape[:2])
    )
    s = min(x.shape[1], c.text_len)
    out = np.zeros((x.shape[0], c.text_len, c.text_dim), np.float32)
    out_mask = np.zeros((x.shape[0], c.text_len), bool)
    out[:, :s], out_mask[:, :s] = x[:, :s], m[:, :s]
    out *= out_mask[..., None]
    if pooled is not None:
        pooled = np.asarray(pooled, np.float32).reshape(x.shape[0], -1)
        if pooled.shape[-1] != getattr(c, "pooled_dim", -1):
            raise ValueError(f"{source}: pooled embeddings of shape {pooled.shape} do not fit")
        pooled = jnp.asarray(pooled)
    return PromptEmbeds(jnp.asarray(out), jnp.asarray(out_mask), pooled)


# -- denoising ------------------------------------------------------------------------------------


def denoise(
    model: nnx.Module,
    noise: jax.Array,
    cond: Conditioning,
    negative: Conditioning | None,
    *,
    solver,
    guidance: float,
    model_input: Callable[[jax.Array], jax.Array] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> jax.Array:
    """Runs the full sampler loop under one jit; returns the final latent (float32).

    Args:
      model: a DiT called as `model(model_input(x), timestep (b,), **cond)`.
      noise: (b, t, h, w, c) starting noise.
      cond / negative: conditioning pytrees with batch b (negative None disables CFG).
      solver: a `vidax.sampling` solver.
      guidance: classifier-free guidance scale (1 disables CFG).
      model_input: maps the latent to the model input (default: identity).
      on_step: host callback after each step (progress bars).

    Raises:
      ValueError: the latent turned non-finite (NaN or inf), naming the first step where it did.
    """
    graphdef, state = nnx.split(model)
    use_cfg = negative is not None and guidance != 1.0
    run = _compiled_loop(
        graphdef, solver, float(guidance), use_cfg, model_input, on_step is not None
    )
    with sampling.reporting_steps(on_step):
        latents, first_bad = run(state, noise, cond, negative if use_cfg else None)
        # One scalar read after the whole loop: no per-step host sync.
        step = int(first_bad)
    if step >= 0:
        raise ValueError(
            f"sampling produced non-finite latents (NaN or inf) at denoising step {step + 1} of "
            f"{solver.num_steps}: check the weights, the prompt embeddings and the guidance scale"
        )
    return latents


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


@functools.lru_cache(maxsize=16)
def _compiled_loop(graphdef, solver, guidance: float, use_cfg: bool, model_input, progress: bool):
    # Cached on static values only: the progress callback goes through `sampling.step_hook`.
    prepare = model_input or (lambda x: x)

    @jax.jit
    def run(state, noise, cond, negative):
        model = nnx.merge(graphdef, state)

        def model_fn(x, t, c):
            timestep = jnp.full((x.shape[0],), t, jnp.float32)
            return model(prepare(x), timestep, **c).astype(jnp.float32)

        if use_cfg:
            velocity = sampling.classifier_free_guidance(model_fn, cond, negative, guidance)
        else:
            velocity = lambda x, t: model_fn(x, t, cond)
        watched = _WatchFinite(solver)
        x = noise.astype(jnp.float32)
        x, (_, first_bad) = sampling.sample_steps(
            velocity,
            x,
            watched,
            watched.init(x),
            start=0,
            stop=solver.num_steps,
            on_step=sampling.step_hook if progress else None,
        )
        return x, first_bad

    return run


# -- models ---------------------------------------------------------------------------------------


# The parts of a preset that need weights, as `missing_weights` names them.
TRANSFORMER, VAE, TEXT_ENCODER = "transformer", "VAE", "text encoder"


class RandomWeightsWarning(UserWarning):
    """A part of a model runs on random initialisation because the caller asked for it."""


def missing_weights(
    spec: ModelSpec,
    checkpoint: str | os.PathLike | None = None,
    *,
    transformer: bool = True,
    vae: bool = True,
    text_encoder: bool = True,
) -> list[str]:
    """The parts of `spec` (among those asked about) with no weights in `checkpoint` or shipped.

    Returns:
      A sublist of [TRANSFORMER, VAE, TEXT_ENCODER]; a transformer counts as present whenever a
      checkpoint is given (its loader reports what the checkpoint lacks).

    Raises:
      FileNotFoundError: `checkpoint` does not exist.
    """
    root = None
    if checkpoint is not None:
        root = Path(checkpoint)
        if not root.exists():
            raise FileNotFoundError(f"checkpoint not found: {root}")
    missing = []
    if transformer and root is None and _shipped(spec, "transformer.safetensors") is None:
        missing.append(TRANSFORMER)
    if vae and spec.vae is not None and _vae_path(spec, root) is None:
        missing.append(VAE)
    if text_encoder and not _has_text_encoder(spec, root):
        missing.append(TEXT_ENCODER)
    return missing


def _has_text_encoder(spec: ModelSpec, root: Path | None) -> bool:
    if spec.text_encoder == "hashed":  # built in; a trained WordEncoder on top needs weights
        return spec.text_config is None or _text_encoder_path(spec, root) is not None
    if spec.text_encoder.startswith("umt5"):
        return root is not None and (root / "text_encoder").is_dir()
    return False  # not ported: only precomputed embeddings


def missing_message(spec: ModelSpec, missing: list[str]) -> str:
    """One line naming what `spec` has no weights for, and the ways out (random weights can
    stand in for the transformer, the VAE and a trained `WordEncoder`, not for umT5 or LLaVA)."""
    real_text = TEXT_ENCODER in missing and spec.text_encoder != "hashed"
    names = {
        TRANSFORMER: "transformer",
        VAE: f"VAE ({spec.vae_name})",
        TEXT_ENCODER: f"text encoder ({spec.text_encoder if real_text else 'WordEncoder'})",
    }
    parts = [names[m] for m in missing]
    what = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    fix = "pass --checkpoint DIR"
    if real_text and spec.text_encoder.startswith("umt5"):
        fix += " (with text_encoder/ and tokenizer/ for the text encoder) or --prompt-embeds"
    elif real_text:
        fix = "pass --prompt-embeds (vidax does not run this text encoder)"
        fix += " and --checkpoint DIR" if len(missing) > 1 else ""
    if any(m != TEXT_ENCODER or not real_text for m in missing):
        fix += ", or --random-weights to run on random weights (the output is noise)"
    return f"model {spec.name!r} has no weights for its {what}: {fix}"


def _warn_random(spec: ModelSpec, parts: list[str]) -> None:
    warnings.warn(
        RandomWeightsWarning(
            f"RANDOM WEIGHTS (--random-weights): {spec.name!r} runs its {', '.join(parts)} on "
            "random initialisation; the output is noise"
        ),
        stacklevel=3,
    )


def load_transformer(
    spec: ModelSpec,
    checkpoint: str | os.PathLike | None,
    *,
    mesh=None,
    strategy=None,
    random_weights: bool = False,
):
    """The spec's DiT from `checkpoint` (diffusers layout: a pipeline dir with `transformer/`, a
    transformer dir, index or file), or its shipped weights, or (only with `random_weights`,
    warning) random weights.

    Raises:
      FileNotFoundError: `checkpoint` does not exist.
      CheckpointError: no weights and not `random_weights`, or a checkpoint that does not fit.
    """
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        if (path / "transformer").is_dir():
            path = path / "transformer"
        return spec.loader(path, spec.config, mesh=mesh, strategy=strategy)
    shipped = _shipped(spec, "transformer.safetensors")
    if shipped is not None:
        return spec.loader(shipped, spec.config, mesh=mesh, strategy=strategy)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [TRANSFORMER]))
    _warn_random(spec, [TRANSFORMER])
    return _random_transformer(spec, mesh, strategy)


def _random_transformer(spec: ModelSpec, mesh, strategy):
    model = spec.build(seed=0)
    if mesh is not None:
        from vidax.sharding import param_shardings

        state = nnx.state(model)
        nnx.update(model, jax.device_put(state, param_shardings(state, mesh, strategy or "fsdp")))
    return model


def load_vae(
    spec: ModelSpec, checkpoint: str | os.PathLike | None, *, random_weights: bool = False
):
    """The spec's VAE from `<checkpoint>/vae`, its shipped weights, or (only with
    `random_weights`, warning) random weights; None for a spec without a VAE.

    Raises:
      CheckpointError: no weights and not `random_weights`, or a checkpoint that does not fit.
    """
    if spec.vae is None:
        return None
    vae = spec.vae_spec
    path = _vae_path(spec, None if checkpoint is None else Path(checkpoint))
    if path is not None:
        return vae.loader(path, vae.config)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [VAE]))
    _warn_random(spec, [VAE])
    return vae.build(seed=0)


def _vae_path(spec: ModelSpec, root: Path | None) -> Path | None:
    if spec.vae_spec.path is not None:  # read from a checkpoint or given by --vae
        return spec.vae_spec.path
    if root is not None and (root / "vae").is_dir():
        return root / "vae"
    return _shipped(spec, "vae.safetensors")


def _shipped(spec: ModelSpec, filename: str) -> Path | None:
    if spec.weights is None:
        return None
    path = ASSETS / spec.weights / filename
    return path if path.exists() else None


def decode(vae, latents: jax.Array) -> np.ndarray:
    """VAE-decodes (b, t, h, w, c) latents to (b, F, H, W, 3) float32 frames in [0, 1]."""
    graphdef, state = nnx.split(vae)
    pixels = _compiled_decode(graphdef)(state, latents)
    return np.asarray((jnp.clip(pixels, -1.0, 1.0) + 1.0) / 2.0, np.float32)


@functools.lru_cache(maxsize=4)
def _compiled_decode(graphdef):
    return jax.jit(lambda state, z: nnx.merge(graphdef, state).decode(z))


# -- the user-facing call -------------------------------------------------------------------------


def resolve_spec(
    model: str | ModelSpec | None, checkpoint: str | os.PathLike | None = None
) -> ModelSpec:
    """The spec to run: a `ModelSpec` as it is; a preset name (or None) read through the
    checkpoint's own configs when it has them, else the preset.

    Raises:
      ValueError: no model and no checkpoint with configs, or a checkpoint of another family.
    """
    if isinstance(model, ModelSpec):
        return model
    base = None if model is None else get(model)
    if checkpoint is not None and (base is None or pretrained.is_config_dir(checkpoint)):
        return pretrained.spec_from_checkpoint(checkpoint, base)
    if base is None:
        raise ValueError("name a model preset, or pass a checkpoint folder with its configs")
    return base


def with_vae(spec: ModelSpec, path: str | os.PathLike) -> ModelSpec:
    """`spec` decoding with the diffusers VAE at `path` (a VAE folder or a pipeline folder);
    its latent channels must fit the transformer (checked by `geometry`)."""
    spec = dataclasses.replace(spec, vae=pretrained.read_vae(path))
    geometry(spec)
    return spec


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
    transformer: nnx.Module | None = None,
    vae=None,
    text_encoder: nnx.Module | str | os.PathLike | None = None,
    decode_frames: bool = True,
    mesh: Mesh | None = None,
    strategy: str | None = None,
    on_step: Callable[[int], None] | None = None,
    accel: str = "none",
    budget: float | None = None,
    random_weights: bool = False,
) -> Video:
    """Generates a video from a prompt or precomputed embeddings.

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
      on_step: host callback per denoising step.
      accel: progressive sampling (`vidax.dvg.accelerate`): "dvg" (content-aware), "spatial",
        "temporal", "joint", or "none" (this module's sampler).
      budget: for accel != "none", the fraction of full-sampling compute to spend (default
        `vidax.dvg.DEFAULT_BUDGET`).
      random_weights: run the parts that have no weights (transformer, VAE, trained text
        encoder) on random initialisation, with one `RandomWeightsWarning`; without it, missing
        weights are a `CheckpointError` naming every missing part.

    Raises:
      CheckpointError: missing weights (see random_weights) or a checkpoint that does not fit.
      ValueError: bad settings, or non-finite latents after sampling (naming the step).
    """
    spec = resolve_spec(model, checkpoint)
    if isinstance(vae, str | os.PathLike):
        spec = with_vae(spec, vae)
        vae = None
    family = adapter(spec)
    if mesh is not None:
        from vidax.sharding import auto_mesh

        mesh = auto_mesh(mesh)
    d = spec.defaults
    num_frames = d.num_frames if num_frames is None else num_frames
    height, width = d.height if height is None else height, d.width if width is None else width
    steps = d.steps if steps is None else steps
    guidance = d.guidance if guidance is None else guidance
    shift = d.shift if shift is None else shift
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    shape = geometry(spec).latent_shape(num_frames, height, width)

    if (prompt is None) == (prompt_embeds is None):
        raise ValueError("pass exactly one of prompt and prompt_embeds")
    # Every missing part is named at once, before anything loads.
    missing = missing_weights(
        spec,
        checkpoint,
        transformer=transformer is None,
        vae=decode_frames and vae is None,
        text_encoder=prompt is not None and text_encoder is None,
    )
    if missing and not random_weights:
        raise CheckpointError(missing_message(spec, missing))
    if TEXT_ENCODER in missing and spec.text_config is None:  # umT5, LLaVA: no random stand-in
        raise CheckpointError(missing_message(spec, [TEXT_ENCODER]))
    if missing:
        _warn_random(spec, missing)
    if TEXT_ENCODER in missing and spec.text_config is not None:
        text_encoder = _random_text_encoder(spec)
    if prompt is not None:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        text = embed_prompts(spec, prompts, checkpoint, text_encoder=text_encoder)
        neg_text = embed_prompts(
            spec, [negative_prompt] * len(prompts), checkpoint, text_encoder=text_encoder
        )
    else:
        text = _as_embeds(spec, prompt_embeds)
        if negative_prompt_embeds is not None:
            neg_text = _as_embeds(spec, negative_prompt_embeds)
        else:  # an empty negative prompt is all padding
            neg_text = PromptEmbeds(
                jnp.zeros_like(text.embeds),
                jnp.zeros_like(text.mask),
                None if text.pooled is None else jnp.zeros_like(text.pooled),
            )
        if neg_text.batch != text.batch:
            neg_text = jax.tree.map(
                lambda a: jnp.broadcast_to(a[:1], (text.batch, *a.shape[1:])), neg_text
            )
    cond = family.conditioning(spec, text, guidance)
    negative = None
    if not family.embedded_guidance(spec):
        negative = family.conditioning(spec, neg_text, guidance)
    cfg_scale = 1.0 if family.embedded_guidance(spec) else guidance

    solver = d.solver(sampler=sampler, steps=steps, shift=shift)
    noise = jax.random.normal(jax.random.key(seed), (text.batch, *shape), jnp.float32)
    initial_noise = np.asarray(noise)  # host copy: `Video.noise`
    if transformer is None and TRANSFORMER in missing:
        transformer = _random_transformer(spec, mesh, strategy)
    elif transformer is None:
        transformer = load_transformer(spec, checkpoint, mesh=mesh, strategy=strategy)
    model_input = None
    if family.model_input is not ADAPTERS["wan"].model_input:
        model_input = _ModelInput(family.model_input, spec)
    run = functools.partial(
        denoise,
        transformer,
        solver=solver,
        guidance=cfg_scale,
        model_input=model_input,
        on_step=on_step,
    )
    choices: list = []
    if accel != "none":
        from vidax import dvg

        def run(noise, cond, negative):
            latents, chosen = dvg.accelerate(
                transformer,
                noise,
                cond,
                negative,
                solver=solver,
                guidance=cfg_scale,
                accel=accel,
                budget=dvg.DEFAULT_BUDGET if budget is None else budget,
                policy=dvg.Policy(spatial=spec.dvg_spatial),
                model_input=model_input,
                on_step=on_step,
            )
            choices.extend(chosen)
            return latents

    started = time.perf_counter()
    if mesh is not None:
        from vidax.sharding import use_mesh

        batch_axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
        noise = jax.device_put(noise, NamedSharding(mesh, PartitionSpec(batch_axes or None)))
        with use_mesh(mesh, strategy or "fsdp"):
            latents = jax.block_until_ready(run(noise, cond, negative))
    else:
        latents = jax.block_until_ready(run(noise, cond, negative))
    denoise_seconds = time.perf_counter() - started
    if not np.isfinite(np.asarray(latents)).all():  # `denoise` names the step; dvg cannot
        raise ValueError(f"sampling (--accel {accel}) produced non-finite latents (NaN or inf)")

    frames = None
    if decode_frames:
        if vae is None and VAE in missing:
            vae = spec.vae_spec.build(seed=0)
        elif vae is None:
            vae = load_vae(spec, checkpoint)
        if vae is not None:
            frames = decode(vae, latents)
            frames = frames[0] if frames.shape[0] == 1 else frames
    return Video(
        frames=frames,
        latents=np.asarray(latents),
        fps=d.fps,
        noise=initial_noise,
        choices=choices or None,
        denoise_seconds=denoise_seconds,
    )


@dataclasses.dataclass
class Loaded:
    """A model loaded once to generate many videos: its spec and its built parts.

    text_encoder is a built `WordEncoder`, a path given to `load`, or None (the checkpoint's
    own umT5, read on first use, or the built-in hashed embedder).
    """

    spec: ModelSpec
    transformer: nnx.Module
    vae: nnx.Module | None
    text_encoder: nnx.Module | str | os.PathLike | None
    checkpoint: Path | None

    def generate(self, prompt: str | list[str] | None = None, **kwargs) -> Video:
        """`generate` with this model's parts (keyword arguments as there)."""
        return generate(
            self.spec,
            prompt,
            transformer=self.transformer,
            vae=self.vae,
            text_encoder=self.text_encoder,
            checkpoint=self.checkpoint,
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
) -> Loaded:
    """Builds a model from a diffusers checkpoint's configs (or a preset) and loads its weights.

    Args:
      checkpoint: a diffusers pipeline folder (`model_index.json`), a transformer folder, or
        weights for `model`'s config; None: the preset's shipped weights.
      model: preset name (the default for what the checkpoint does not say) or `ModelSpec`.
      vae / text_encoder: paths replacing one component (see `generate`).
      mesh / strategy: place the transformer's parameters sharded.
      random_weights: parts without weights run on random initialisation (warning).

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
        from vidax.sharding import auto_mesh

        mesh = auto_mesh(mesh)
    missing = missing_weights(spec, checkpoint, text_encoder=text_encoder is None)
    if missing and not random_weights:
        raise CheckpointError(missing_message(spec, missing))
    transformer = load_transformer(
        spec, checkpoint, mesh=mesh, strategy=strategy, random_weights=random_weights
    )
    loaded_vae = load_vae(spec, checkpoint, random_weights=random_weights)
    encoder = text_encoder
    if encoder is None and spec.text_config is not None:
        encoder = load_text_encoder(spec, checkpoint, random_weights=random_weights)
    return Loaded(
        spec=spec,
        transformer=transformer,
        vae=loaded_vae,
        text_encoder=encoder,
        checkpoint=None if checkpoint is None else Path(checkpoint),
    )


jax.tree_util.register_dataclass(
    PromptEmbeds, data_fields=["embeds", "mask", "pooled"], meta_fields=[]
)


@dataclasses.dataclass(frozen=True)
class _ModelInput:
    """`fn(spec, x)` as `x -> model input`, equal (and hashing equal) for equal (fn, spec): a
    `functools.partial` made per call made every cached sampling program miss."""

    fn: Callable
    spec: ModelSpec

    def __call__(self, x):
        return self.fn(self.spec, x)


def _as_embeds(spec: ModelSpec, value) -> PromptEmbeds:
    if isinstance(value, PromptEmbeds):
        return fit_prompt_embeds(spec, value.embeds, value.mask, value.pooled)
    return fit_prompt_embeds(spec, value)
