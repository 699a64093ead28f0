"""Text -> latents -> frames, shared by every registered DiT.

    video = vidax.pipeline.generate("tiny", prompt="a red circle bouncing", seed=0)
    video.frames  # (F, H, W, 3) float32 in [0, 1]

All families go through `denoise`: one `jax.jit` around the whole sampler loop (`lax.fori_loop`),
classifier-free guidance batched into one forward per step. A family only has to accept
`model(x, timestep, **conditioning)`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
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
from vidax.models.registry import ModelSpec, get

Conditioning = dict[str, Any]
ASSETS = Path(__file__).parent / "assets"


@dataclasses.dataclass(frozen=True)
class Video:
    """A generated clip: frames (F, H, W, 3) float32 in [0, 1] (None without a VAE), latents
    (b, t, h, w, c) float32, and the frame rate to write it at."""

    frames: np.ndarray | None
    latents: np.ndarray
    fps: int


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


def geometry(spec: ModelSpec) -> LatentGeometry:
    """The latent geometry of a preset (its VAE's strides, or Wan's 4x8x8 without a VAE)."""
    temporal, spatial = 4, 8
    if spec.vae is not None:
        vae_config = _vae_config(spec.vae)
        temporal, spatial = vae_config.temporal_factor, vae_config.spatial_factor
        if vae_config.z_dim != spec.config.in_channels:
            raise ValueError(
                f"model {spec.name!r}: VAE {spec.vae!r} has {vae_config.z_dim} latent channels "
                f"but the transformer expects {spec.config.in_channels}"
            )
    return LatentGeometry(
        temporal_stride=temporal,
        spatial_stride=spatial,
        patch=tuple(spec.config.patch_size),
        channels=spec.config.in_channels,
    )


def _vae_config(name: str):
    from vidax.models.wan_vae import PRESETS

    if name not in PRESETS:
        raise ValueError(f"unknown VAE preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


# -- conditioning ---------------------------------------------------------------------------------


def encode_prompts(spec: ModelSpec, prompts: list[str]) -> Conditioning:
    """Conditioning for `prompts` with the spec's built-in text embedder.

    Presets whose text encoder must be supplied by the user (umT5, LLaVA, ...) take precomputed
    embeddings instead (`load_prompt_embeds`).
    """
    if spec.text_encoder != "hashed":
        raise ValueError(
            f"model {spec.name!r} needs its text encoder ({spec.text_encoder}); pass precomputed "
            "prompt embeddings (--prompt-embeds) instead of a prompt"
        )
    from vidax.text.hashed import HashedTextEmbedder

    c = spec.config
    embeds, mask = HashedTextEmbedder(dim=c.text_dim, text_len=c.text_len)(prompts)
    return _conditioning(spec, jnp.asarray(embeds), jnp.asarray(mask))


def _conditioning(spec: ModelSpec, embeds: jax.Array, mask: jax.Array | None) -> Conditioning:
    if spec.family == "wan":
        return {"context": embeds}
    raise NotImplementedError(f"prompt conditioning for family {spec.family!r}")


def load_prompt_embeds(
    path: str | os.PathLike, spec: ModelSpec
) -> tuple[jax.Array, jax.Array | None]:
    """Reads precomputed prompt embeddings (`.npy`, or `.safetensors` with key `prompt_embeds`
    and optionally `negative_prompt_embeds`), padded/truncated to the model's text length.

    Returns (embeds (b, s, d), negative (b, s, d) or None).
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
        arrays = {k: np.asarray(reader[k], np.float32) for k in reader}
    else:
        raise ValueError(f"{path}: prompt embeddings must be .npy or .safetensors")
    out = [_fit_text(arrays["prompt_embeds"], spec, path)]
    neg = arrays.get("negative_prompt_embeds")
    out.append(None if neg is None else _fit_text(neg, spec, path))
    return out[0], out[1]


def _fit_text(x: np.ndarray, spec: ModelSpec, path) -> jax.Array:
    c = spec.config
    x = np.asarray(x, np.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != c.text_dim:
        raise ValueError(f"{path}: prompt embeddings must be (b, s, {c.text_dim}), got {x.shape}")
    s = min(x.shape[1], c.text_len)
    out = np.zeros((x.shape[0], c.text_len, c.text_dim), np.float32)
    out[:, :s] = x[:, :s]
    return jnp.asarray(out)


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
    """Runs the full sampler loop under one jit; returns the final latent (float32).

    Args:
      model: a DiT called as `model(x, timestep (b,), **cond)`.
      noise: (b, t, h, w, c) starting noise.
      cond / negative: conditioning pytrees with batch b (negative None disables CFG).
      solver: a `vidax.sampling` solver.
      guidance: classifier-free guidance scale (1 disables CFG).
      on_step: host callback after each step (progress bars).
    """
    graphdef, state = nnx.split(model)
    use_cfg = negative is not None and guidance != 1.0
    run = _compiled_loop(graphdef, solver, float(guidance), use_cfg, on_step)
    return run(state, noise, cond, negative if use_cfg else None)


@functools.lru_cache(maxsize=16)
def _compiled_loop(graphdef, solver, guidance: float, use_cfg: bool, on_step):
    @jax.jit
    def run(state, noise, cond, negative):
        model = nnx.merge(graphdef, state)

        def model_fn(x, t, c):
            timestep = jnp.full((x.shape[0],), t, jnp.float32)
            return model(x, timestep, **c).astype(jnp.float32)

        if use_cfg:
            velocity = sampling.classifier_free_guidance(model_fn, cond, negative, guidance)
        else:
            velocity = lambda x, t: model_fn(x, t, cond)
        return sampling.sample(velocity, noise.astype(jnp.float32), solver, on_step=on_step)

    return run


# -- models ---------------------------------------------------------------------------------------


def load_transformer(
    spec: ModelSpec, checkpoint: str | os.PathLike | None, *, mesh=None, strategy=None
):
    """The spec's DiT from `checkpoint` (diffusers layout: a pipeline dir with `transformer/`, a
    transformer dir, index or file), or its shipped weights, or (warning) random weights."""
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
    warnings.warn(
        f"no weights for {spec.name!r}: using random initialisation (output will be noise)",
        stacklevel=2,
    )
    model = spec.build(seed=0)
    if mesh is not None:
        from vidax.sharding import param_shardings

        state = nnx.state(model)
        nnx.update(model, jax.device_put(state, param_shardings(state, mesh, strategy or "fsdp")))
    return model


def load_vae(spec: ModelSpec, checkpoint: str | os.PathLike | None):
    """The spec's VAE from `<checkpoint>/vae`, its shipped weights, or None."""
    if spec.vae is None:
        return None
    from vidax.models import wan_vae

    config = _vae_config(spec.vae)
    if checkpoint is not None and (Path(checkpoint) / "vae").is_dir():
        return wan_vae.load(Path(checkpoint) / "vae", config)
    shipped = _shipped(spec, "vae.safetensors")
    if shipped is not None:
        return wan_vae.load(shipped, config)
    warnings.warn(f"no VAE weights for {spec.name!r}: using random initialisation", stacklevel=2)
    return wan_vae.WanVAE(config, rngs=nnx.Rngs(0))


def _shipped(spec: ModelSpec, filename: str) -> Path | None:
    if spec.weights is None:
        return None
    path = ASSETS / spec.weights / filename
    return path if path.exists() else None


# -- the user-facing call -------------------------------------------------------------------------


def generate(
    model: str | ModelSpec,
    prompt: str | list[str] | None = None,
    *,
    prompt_embeds: jax.Array | np.ndarray | None = None,
    negative_prompt: str = "",
    negative_prompt_embeds: jax.Array | np.ndarray | None = None,
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
    decode: bool = True,
    mesh: Mesh | None = None,
    strategy: str | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Video:
    """Generates a video from a prompt (built-in text embedder) or precomputed embeddings.

    Args:
      model: preset name or `ModelSpec`.
      prompt / prompt_embeds: exactly one; embeddings are (b, s, text_dim) or (s, text_dim).
      negative_prompt / negative_prompt_embeds: the CFG unconditional branch.
      num_frames, height, width: pixel video size (frames 4k+1, sizes multiples of 16 for Wan).
      steps, guidance, shift, sampler: sampling settings (default: the preset's).
      seed: noise seed.
      checkpoint: diffusers-layout weights (default: shipped weights).
      transformer / vae: already-built models (skip loading).
      decode: decode latents to frames with the VAE.
      mesh / strategy: run sharded over `mesh` with a `vidax.sharding` strategy.
      on_step: host callback per denoising step.
    """
    spec = get(model) if isinstance(model, str) else model
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
    if prompt is not None:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        cond = encode_prompts(spec, prompts)
        negative = encode_prompts(spec, [negative_prompt] * len(prompts))
    else:
        embeds = _fit_text(np.asarray(prompt_embeds), spec, "prompt_embeds")
        cond = _conditioning(spec, embeds, None)
        if negative_prompt_embeds is not None:
            neg = _fit_text(np.asarray(negative_prompt_embeds), spec, "negative_prompt_embeds")
        else:
            neg = jnp.zeros_like(embeds)  # Wan's empty negative prompt is all padding
        if neg.shape[0] != embeds.shape[0]:
            neg = jnp.broadcast_to(neg[:1], embeds.shape)
        negative = _conditioning(spec, neg, None)
    batch = jax.tree.leaves(cond)[0].shape[0]

    solver = sampling.make_solver(sampler or d.sampler, steps, shift)
    noise = jax.random.normal(jax.random.key(seed), (batch, *shape), jnp.float32)
    if transformer is None:
        transformer = load_transformer(spec, checkpoint, mesh=mesh, strategy=strategy)
    if mesh is not None:
        from vidax.sharding import use_mesh

        batch_axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
        noise = jax.device_put(noise, NamedSharding(mesh, PartitionSpec(batch_axes or None)))
        with use_mesh(mesh, strategy or "fsdp"):
            latents = denoise(
                transformer,
                noise,
                cond,
                negative,
                solver=solver,
                guidance=guidance,
                on_step=on_step,
            )
    else:
        latents = denoise(
            transformer, noise, cond, negative, solver=solver, guidance=guidance, on_step=on_step
        )

    frames = None
    if decode:
        vae = vae if vae is not None else load_vae(spec, checkpoint)
        if vae is not None:
            pixels = _decode(vae, latents)
            frames = np.asarray((jnp.clip(pixels, -1.0, 1.0) + 1.0) / 2.0, np.float32)
            frames = frames[0] if frames.shape[0] == 1 else frames
    return Video(frames=frames, latents=np.asarray(latents), fps=d.fps)


def _decode(vae, latents: jax.Array) -> jax.Array:
    graphdef, state = nnx.split(vae)
    return _compiled_decode(graphdef)(state, latents)


@functools.lru_cache(maxsize=4)
def _compiled_decode(graphdef):
    return jax.jit(lambda state, z: nnx.merge(graphdef, state).decode(z))
