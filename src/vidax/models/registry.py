"""One registry of model presets: what to build, how to load it, and how to sample it.

`get(name)` returns a `ModelSpec` (a text-to-video DiT), `get_causal(name)` a `CausalPreset` (a
chunk-autoregressive model built on a registered DiT); the two share one namespace and `names()`
lists both. The CLI, the pipeline, the server and the benchmarks use nothing else to find
models. A spec names its transformer family and config, the VAE and text encoder it pairs with,
and the sampling defaults of its reference implementation.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar

import jax
from flax import nnx

from vidax import sampling
from vidax.models import (
    clip_vision,
    hunyuan,
    hunyuan15,
    hunyuan15_vae,
    hunyuan_vae,
    siglip_vision,
    wan,
    wan_vae,
)
from vidax.models.causal import ForcingConfig
from vidax.models.dit_stages import VideoDiT
from vidax.models.geometry import LatentGeometry
from vidax.models.video_vae import VideoVAE
from vidax.models.word_encoder import WordEncoderConfig

# What a preset generates from: text only, text and an image, or either (`ModelSpec.task`).
TASKS = ("t2v", "i2v", "ti2v")

# Weights shipped with vidax: `ModelSpec.weights` / `CausalPreset.weights` name a folder here.
ASSETS = Path(__file__).resolve().parent.parent / "assets"


M = TypeVar("M", bound=nnx.Module, covariant=True)


class ModelClass(Protocol[M]):
    """A model class: built from its config and the random streams (`Model(config, rngs=...)`)."""

    def __call__(self, config: Any, /, *, rngs: nnx.Rngs) -> M: ...


@dataclasses.dataclass(frozen=True)
class Family(Generic[M]):
    """A model family: its package (exporting PRESETS, `load(path, config, ...)`, `key_map`,
    `from_diffusers_config`; DiTs also `conditioning` and optionally `model_input` and
    `embedded_guidance`, see `vidax.pipeline.Adapter`) and its model class."""

    module: ModuleType
    model: ModelClass[M]


FAMILIES: dict[str, Family[VideoDiT]] = {
    "wan": Family(wan, wan.WanTransformer),
    "hunyuanvideo": Family(hunyuan, hunyuan.HunyuanVideoTransformer),
    "hunyuanvideo15": Family(hunyuan15, hunyuan15.HunyuanVideo15Transformer),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingDefaults:
    """Sampling settings of a preset's reference pipeline (overridable per call)."""

    num_frames: int
    height: int
    width: int
    steps: int
    shift: float
    guidance: float
    sampler: str = "unipc"
    fps: int = 16
    # Two-expert models (Wan 2.2 A14B): the low-noise expert's guidance scale (None: `guidance`).
    guidance_2: float | None = None
    # Solver fields beyond the shift (e.g. UniPC's order), as read from a checkpoint's scheduler.
    solver_options: tuple[tuple[str, Any], ...] = ()

    def solver(self, *, sampler: str | None = None, steps: int | None = None, shift=None):
        """The `vidax.sampling` solver of these defaults, any of them overridden (the
        `solver_options` apply to the default sampler only)."""
        name = sampler or self.sampler
        return sampling.make_solver(
            name,
            self.steps if steps is None else steps,
            self.shift if shift is None else shift,
            **(dict(self.solver_options) if name == self.sampler else {}),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything needed to build, load and sample one preset.

    Attributes:
      name: preset name, e.g. "wan2.1-1.3b".
      family: transformer family key ("wan", "hunyuanvideo", "hunyuanvideo15").
      config: the transformer config (family-specific frozen dataclass).
      vae: VAE preset name, resolved by `get_vae` across VAE families, or a `VAESpec` (e.g. read
        from a checkpoint by `vidax.models.pretrained`); None: latents only.
      text_encoder: "hashed" (built in, no download) or the name of an encoder preset that the
        user provides weights for (e.g. "umt5-xxl").
      weights: packaged asset folder with shipped weights (`vidax/assets/<weights>`), if any.
      defaults: sampling defaults.
      dvg_spatial: whether DVG may reduce space (`vidax.dvg.Policy.spatial`): True where the
        DiT denoises coarser grids consistently (trained at several resolutions); False for
        a DiT trained at one latent size only.
      text_config: for the "hashed" text encoder, the `WordEncoderConfig`
        of a trained encoder over the hashed word vectors (weights `text_encoder.safetensors`
        beside the transformer's); None: the hashed vectors go to the DiT as they are.
      task: "t2v" (text-to-video: an image is refused), "i2v" (image-to-video: an image is
        required) or "ti2v" (either).
      image_encoder: the image encoder preset (`get_image_encoder`: CLIP or SigLIP) whose tokens
        an image-to-video transformer reads, weights in the checkpoint's `image_encoder/`; None.
      boundary_ratio: two experts (Wan 2.2 A14B): the transformer denoises timesteps
        t >= boundary_ratio * 1000 and a second one of the same config (the checkpoint's
        `transformer_2/`) the rest, with `defaults.guidance_2`; None: one transformer.
      text_encoder_weights: asset folder of the trained text encoder's weights when they are
        not in `weights` (a causal preset pinning the encoder it was trained with); None.
      caption_grammar: "shapes" for models trained only on `vidax.data.shapes` captions:
        prompts are first read into that grammar (`vidax.data.shapes.canonical_caption`:
        'a red square moving right' -> 'a red square bouncing slowly to the right'); None:
        prompts go to the text encoder as written.
    """

    name: str
    family: str
    config: Any
    vae: str | VAESpec | None
    text_encoder: str
    weights: str | None = None
    defaults: SamplingDefaults
    dvg_spatial: bool = True
    text_config: Any = None
    task: str = "t2v"
    image_encoder: str | None = None
    boundary_ratio: float | None = None
    text_encoder_weights: str | None = None
    caption_grammar: str | None = None

    def __post_init__(self):
        if self.caption_grammar not in (None, "shapes"):
            raise ValueError(
                f"model {self.name!r}: caption_grammar must be None or 'shapes', got "
                f"{self.caption_grammar!r}"
            )
        if self.task not in TASKS:
            raise ValueError(f"model {self.name!r}: task must be one of {TASKS}, got {self.task!r}")
        if self.boundary_ratio is not None and not 0 < self.boundary_ratio < 1:
            raise ValueError(
                f"model {self.name!r}: boundary_ratio must be in (0, 1), got {self.boundary_ratio}"
            )
        if self.image_encoder is not None and self.task == "t2v":
            raise ValueError(f"model {self.name!r}: a text-to-video model has no image encoder")

    @property
    def module(self) -> ModelClass[VideoDiT]:
        return FAMILIES[self.family].model

    @property
    def family_module(self) -> ModuleType:
        """The family's package (`vidax.models.wan`, ...)."""
        return FAMILIES[self.family].module

    @property
    def loader(self) -> Callable:
        """`load(path, config, *, mesh=None, strategy=None)` of the family."""
        return FAMILIES[self.family].module.load

    @property
    def vae_spec(self) -> VAESpec | None:
        """The VAE this model decodes with (None: latents only)."""
        if self.vae is None or isinstance(self.vae, VAESpec):
            return self.vae
        return get_vae(self.vae)

    @property
    def image_encoder_spec(self) -> ImageEncoderSpec | None:
        """The image encoder preset this model reads image tokens from (None: none)."""
        return None if self.image_encoder is None else get_image_encoder(self.image_encoder)

    @property
    def vae_name(self) -> str | None:
        return self.vae if self.vae is None or isinstance(self.vae, str) else self.vae.name

    def vae_preset(self) -> str:
        """The name of this spec's VAE (what training recipes look presets up by).

        Raises:
          ValueError: the spec has no VAE.
        """
        if self.vae_name is None:
            raise ValueError(f"model {self.name!r} has no VAE")
        return self.vae_name

    def weights_folder(self) -> Path:
        """`vidax/assets/<weights>`, where this preset's shipped weights live.

        Raises:
          ValueError: the preset ships no weights.
        """
        if self.weights is None:
            raise ValueError(f"model {self.name!r} ships no weights folder")
        return ASSETS / self.weights

    def build(self, *, seed: int = 0, config=None) -> VideoDiT:
        """A randomly initialised transformer (use `loader` for real weights)."""
        return self.module(config or self.config, rngs=nnx.Rngs(seed))

    def with_config(self, **changes) -> ModelSpec:
        """A copy with transformer-config fields replaced (validated by the config)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))

    def num_params(self) -> int:
        abstract = nnx.eval_shape(lambda: self.build())
        return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    @property
    def latent_channels(self) -> int:
        """Channels of the latent being denoised (the model input may add condition channels)."""
        return self.config.out_channels

    def geometry(self) -> LatentGeometry:
        """The latent geometry: the VAE's strides (4x8x8 without a VAE) and the DiT's patch.

        Raises:
          ValueError: the VAE's latent channels differ from the transformer's.
        """
        temporal, spatial = 4, 8
        channels = self.latent_channels
        vae_spec = self.vae_spec
        if vae_spec is not None:
            vae = vae_spec.config
            temporal, spatial = vae.temporal_factor, vae.spatial_factor
            if vae.z_dim != channels:
                raise ValueError(
                    f"model {self.name!r}: VAE {self.vae_name!r} has {vae.z_dim} latent channels "
                    f"but the transformer denoises {channels}"
                )
        return LatentGeometry(
            temporal_stride=temporal,
            spatial_stride=spatial,
            patch=tuple(self.config.patch_size),
            channels=channels,
        )

    def load(
        self,
        checkpoint: str | os.PathLike | None = None,
        *,
        mesh=None,
        strategy: str | None = None,
        random_weights: bool = False,
    ) -> VideoDiT:
        """The transformer with its weights: `checkpoint`, else the shipped ones, else (only with
        `random_weights`, warning) random ones (`vidax.models.weights.load_transformer`)."""
        # Function-local: `weights` reads specs (cycle).
        from vidax.models import weights

        return weights.load_transformer(
            self, checkpoint, mesh=mesh, strategy=strategy, random_weights=random_weights
        )

    def load_vae(
        self, checkpoint: str | os.PathLike | None = None, *, random_weights: bool = False
    ) -> nnx.Module | None:
        """The VAE with its weights (`vidax.models.weights.load_vae`); None without a VAE."""
        from vidax.models import weights  # cycle, as in `load`

        return weights.load_vae(self, checkpoint, random_weights=random_weights)


def _specs() -> dict[str, ModelSpec]:
    WAN = wan.PRESETS
    specs = [
        # The embedded default (issue 16's v2): a Wan DiT (dim 256, 8 layers, 8.0 M parameters)
        # conditioned by a trained WordEncoder over the hashed word vectors, on the `shapes`
        # VAE; trained on one TPU v5e chip at 32-64 px and 1-33 frames by `vidax train all`
        # (vidax/assets/tiny/TRAINING.md).
        ModelSpec(
            name="tiny",
            family="wan",
            config=WAN["tiny-v2"],
            vae="shapes",
            text_encoder="hashed",
            text_config=WordEncoderConfig(in_dim=128, dim=256, num_layers=3, text_len=32),
            weights="tiny",
            defaults=SamplingDefaults(
                num_frames=33, height=64, width=64, steps=20, shift=3.0, guidance=4.0, fps=8
            ),
            # Until benchmarks/dvg_consistency.py says space /2 keeps it (docs/dvg.md §6.4).
            dvg_spatial=False,
            caption_grammar="shapes",
        ),
        # The first tiny DiT (1.1 M parameters, hashed text, CPU-trained at 64x64; shipped until
        # 2026-12-06, its weights are in git: `git show 1dc64c8:src/vidax/assets/tiny`). It
        # ships no weights now: it is the base `tiny-causal` was distilled from.
        ModelSpec(
            name="tiny-v1",
            family="wan",
            config=WAN["tiny"],
            vae="shapes-v1.5",
            text_encoder="hashed",
            defaults=SamplingDefaults(
                num_frames=33, height=64, width=64, steps=20, shift=3.0, guidance=4.0, fps=8
            ),
            dvg_spatial=False,
            caption_grammar="shapes",
        ),
        ModelSpec(
            name="wan2.1-1.3b",
            family="wan",
            config=WAN["wan2.1-1.3b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            defaults=SamplingDefaults(
                num_frames=81, height=480, width=832, steps=30, shift=3.0, guidance=5.0
            ),
        ),
        ModelSpec(
            name="wan2.1-14b",
            family="wan",
            config=WAN["wan2.1-14b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            defaults=SamplingDefaults(
                num_frames=81, height=720, width=1280, steps=50, shift=5.0, guidance=5.0
            ),
        ),
        # Image-to-video (issue 21). Wan 2.1 I2V: CLIP ViT-H/14 tokens + first-frame latents;
        # Wan's generate.py samples 40 steps, shift 3.0 at 480p and 5.0 at 720p.
        ModelSpec(
            name="wan2.1-i2v-14b-480p",
            family="wan",
            config=WAN["wan2.1-i2v-14b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            task="i2v",
            image_encoder="clip-vit-h-14",
            defaults=SamplingDefaults(
                num_frames=81, height=480, width=832, steps=40, shift=3.0, guidance=5.0
            ),
        ),
        ModelSpec(
            name="wan2.1-i2v-14b-720p",
            family="wan",
            config=WAN["wan2.1-i2v-14b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            task="i2v",
            image_encoder="clip-vit-h-14",
            defaults=SamplingDefaults(
                num_frames=81, height=720, width=1280, steps=40, shift=5.0, guidance=5.0
            ),
        ),
        # Wan 2.2 A14B: a high-noise and a low-noise expert of the 14B shape, switched at
        # boundary_ratio; settings of Wan 2.2's wan/configs (guide scales: high, low noise).
        ModelSpec(
            name="wan2.2-t2v-a14b",
            family="wan",
            config=WAN["wan2.1-14b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            boundary_ratio=0.875,
            defaults=SamplingDefaults(
                num_frames=81,
                height=720,
                width=1280,
                steps=40,
                shift=12.0,
                guidance=4.0,
                guidance_2=3.0,
            ),
        ),
        ModelSpec(
            name="wan2.2-i2v-a14b",
            family="wan",
            config=WAN["wan2.2-i2v-a14b"],
            vae="wan2.1",
            text_encoder="umt5-xxl",
            task="i2v",
            boundary_ratio=0.9,
            defaults=SamplingDefaults(
                num_frames=81,
                height=720,
                width=1280,
                steps=40,
                shift=5.0,
                guidance=3.5,
                guidance_2=3.5,
            ),
        ),
        # Wan 2.2 TI2V-5B: text- and image-to-video in one model over the Wan 2.2 VAE (48
        # channels, 16x spatial); an image replaces the first latent frame, which is then held
        # at t = 0 (per-token timesteps), as diffusers' `expand_timesteps` does.
        ModelSpec(
            name="wan2.2-ti2v-5b",
            family="wan",
            config=WAN["wan2.2-ti2v-5b"],
            vae="wan2.2-vae",
            text_encoder="umt5-xxl",
            task="ti2v",
            defaults=SamplingDefaults(
                num_frames=121, height=704, width=1280, steps=50, shift=5.0, guidance=5.0, fps=24
            ),
        ),
        # Tiny random-weight image-to-video models (tests, CLI examples): Wan 2.1 I2V with a
        # tiny CLIP, the two-expert scheme, and TI2V on the tiny Wan 2.2 VAE.
        ModelSpec(
            name="wan2.1-i2v-tiny",
            family="wan",
            config=WAN["i2v-tiny"],
            vae="tiny",
            text_encoder="hashed",
            task="i2v",
            image_encoder="tiny",
            defaults=SamplingDefaults(
                num_frames=9, height=64, width=64, steps=8, shift=3.0, guidance=5.0
            ),
        ),
        ModelSpec(
            name="wan2.2-a14b-tiny",
            family="wan",
            config=WAN["t2v-tiny"],
            vae="tiny",
            text_encoder="hashed",
            boundary_ratio=0.875,
            defaults=SamplingDefaults(
                num_frames=9, height=64, width=64, steps=8, shift=12.0, guidance=4.0, guidance_2=3.0
            ),
        ),
        ModelSpec(
            name="wan2.2-ti2v-tiny",
            family="wan",
            config=WAN["ti2v-tiny"],
            vae="wan2.2-tiny",
            text_encoder="hashed",
            task="ti2v",
            defaults=SamplingDefaults(
                num_frames=9, height=64, width=64, steps=8, shift=5.0, guidance=5.0, fps=24
            ),
        ),
    ]
    # (family, preset, its VAE, the tiny preset's VAE, text encoder, sampling defaults)
    for family, preset, vae, tiny_vae, text, defaults in (
        (
            "hunyuanvideo",
            "hunyuanvideo",
            "hunyuanvideo",
            "hunyuanvideo-tiny",
            "llava-llama3+clip-l",
            SamplingDefaults(
                num_frames=129,
                height=720,
                width=1280,
                steps=50,
                shift=7.0,
                guidance=6.0,
                sampler="euler",
                fps=24,
                solver_options=(("linspace_sigmas", True),),
            ),
        ),
        (
            "hunyuanvideo15",
            "hunyuanvideo1.5",
            "hunyuanvideo15",
            "hunyuanvideo15-tiny",
            "qwen2.5-vl+byt5",
            SamplingDefaults(
                num_frames=121,
                height=480,
                width=848,
                steps=50,
                shift=5.0,
                guidance=6.0,
                sampler="euler",
                fps=24,
                solver_options=(("linspace_sigmas", True),),
            ),
        ),
    ):
        presets = FAMILIES[family].module.PRESETS
        if preset in presets:
            specs.append(
                ModelSpec(
                    name=preset,
                    family=family,
                    config=presets[preset],
                    vae=vae,
                    text_encoder=text,
                    defaults=defaults,
                )
            )
        tiny = f"{preset}-tiny"
        if "tiny" in presets:
            specs.append(
                ModelSpec(
                    name=tiny,
                    family=family,
                    config=presets["tiny"],
                    vae=tiny_vae,
                    text_encoder="hashed",
                    defaults=dataclasses.replace(
                        defaults, num_frames=9, height=64, width=64, steps=8
                    ),
                )
            )
    # HunyuanVideo-1.5 image-to-video: the text-to-video transformer's shape, reading the
    # first frame's latent beside the noise and its SigLIP tokens; diffusers' 480p I2V pipeline
    # samples as the 480p T2V one does (121 frames, 50 steps, CFG 6, shift 5; the 720p I2V model
    # uses shift 7). The tiny stand-in reads a tiny SigLIP's 16 tokens.
    t2v = {s.name: s for s in specs}
    specs += [
        dataclasses.replace(
            t2v["hunyuanvideo1.5"],
            name="hunyuanvideo1.5-i2v",
            task="i2v",
            image_encoder="siglip-so400m-patch14-384",
        ),
        dataclasses.replace(
            t2v["hunyuanvideo1.5-tiny"],
            name="hunyuanvideo1.5-i2v-tiny",
            config=dataclasses.replace(t2v["hunyuanvideo1.5-tiny"].config, image_len=16),
            task="i2v",
            image_encoder="siglip-tiny",
        ),
    ]
    return {s.name: s for s in specs}


# VAE families: package exporting PRESETS, load(path, config), from_diffusers_config.
VAE_FAMILIES: dict[str, Family[VideoVAE]] = {
    "wan": Family(wan_vae, wan_vae.WanVAE),
    "hunyuan": Family(hunyuan_vae, hunyuan_vae.HunyuanVideoVAE),
    "hunyuan15": Family(hunyuan15_vae, hunyuan15_vae.HunyuanVideo15VAE),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VAESpec:
    """A VAE: config (with `z_dim`, `temporal_factor`, `spatial_factor`), class, loader, and
    (for one read from a checkpoint) where its weights are."""

    name: str
    family: str
    config: Any
    path: Path | None = None

    @property
    def module(self) -> ModelClass[VideoVAE]:
        return VAE_FAMILIES[self.family].model

    @property
    def loader(self) -> Callable:
        return VAE_FAMILIES[self.family].module.load

    def build(self, *, seed: int = 0) -> VideoVAE:
        return self.module(self.config, rngs=nnx.Rngs(seed))


def _find_preset(families: dict[str, Family[Any]], name: str, what: str) -> tuple[str, Any]:
    """(family, config) of preset `name` among `families`' PRESETS, one namespace for all of
    them; a clear error lists the known presets."""
    known: dict[str, tuple[str, Any]] = {}
    for family, entry in families.items():
        for preset, config in entry.module.PRESETS.items():
            if preset in known:  # a clash would shadow silently
                raise ValueError(
                    f"{what} preset {preset!r} is defined by {known[preset][0]!r} and {family!r}"
                )
            known[preset] = (family, config)
    if name not in known:
        raise ValueError(f"unknown {what} {name!r}; known {what}s: {', '.join(sorted(known))}")
    return known[name]


def get_vae(name: str) -> VAESpec:
    """The VAE preset `name` from any VAE family; a clear error lists the known presets."""
    family, config = _find_preset(VAE_FAMILIES, name, "VAE")
    return VAESpec(name=name, family=family, config=config)


class ImageEncoder(Protocol):
    """An image-to-video model's image encoder (`clip_vision.CLIPVisionEncoder`,
    `siglip_vision.SiglipVisionEncoder`): its config, and its own preprocessing (RGB images
    (b, H, W, 3) -> its input pixels, on the host). Which of its outputs a DiT reads is the DiT
    family's `image_tokens`."""

    config: Any

    def preprocess(self, images: Any) -> Any: ...


# Image-encoder families (image-to-video): package exporting PRESETS, `load(path, config)`,
# `from_hf_config` and ARCHITECTURES (the transformers classes whose checkpoints it reads).
IMAGE_ENCODER_FAMILIES: dict[str, Family[nnx.Module]] = {
    "clip": Family(clip_vision, clip_vision.CLIPVisionEncoder),
    "siglip": Family(siglip_vision, siglip_vision.SiglipVisionEncoder),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageEncoderSpec:
    """An image encoder: its family ("clip", "siglip"), config, class and loader."""

    name: str
    family: str
    config: Any

    @property
    def module(self) -> ModuleType:
        """The family's package (`vidax.models.clip_vision`, ...)."""
        return IMAGE_ENCODER_FAMILIES[self.family].module

    @property
    def loader(self) -> Callable:
        """`load(path, config, *, mesh=None, strategy=None)` of the family."""
        return self.module.load

    def build(self, *, seed: int = 0) -> nnx.Module:
        """A randomly initialised encoder (use `loader` for real weights)."""
        return IMAGE_ENCODER_FAMILIES[self.family].model(self.config, rngs=nnx.Rngs(seed))


def get_image_encoder(name: str) -> ImageEncoderSpec:
    """The image-encoder preset `name` from any image-encoder family; a clear error lists the
    known presets."""
    family, config = _find_preset(IMAGE_ENCODER_FAMILIES, name, "image encoder")
    return ImageEncoderSpec(name=name, family=family, config=config)


def image_encoder_family(architecture: str) -> str:
    """The image-encoder family whose loader reads checkpoints of the transformers class
    `architecture` (a `config.json`'s "architectures" entry).

    Raises:
      ValueError: no family reads that class.
    """
    for family, entry in IMAGE_ENCODER_FAMILIES.items():
        if architecture in entry.module.ARCHITECTURES:
            return family
    known = [a for entry in IMAGE_ENCODER_FAMILIES.values() for a in entry.module.ARCHITECTURES]
    raise ValueError(f"image encoder {architecture!r} is not one vidax runs ({', '.join(known)})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CausalPreset:
    """A chunk-autoregressive model: a registered DiT plus its chunked-generation settings.

    It reuses `base` (the transformer architecture, VAE and text encoder) and adds the two
    attention configurations it was trained for and the asset folder of its causal weights.
    When the base model's VAE has been retrained since, the preset pins the VAE its latents
    came from (`vae`, shipped beside the causal weights).

    Attributes:
      name: preset name ("tiny-causal").
      base: registered model whose transformer config, VAE and text encoder it uses.
      dense: the Self-Forcing configuration (dense window with attention sink).
      sparse: the Sparse Forcing configuration (persistent memory + selected neighbourhood).
      weights: asset folder holding `dense.safetensors` and `sparse.safetensors`.
      vae: VAE preset the causal weights were trained with, its weights in
        `<weights>/vae.safetensors`; None: the base model's VAE and weights.
      text_encoder: the base's trained text encoder as it was when the causal weights were
        trained ships beside them (`<weights>/text_encoder.safetensors`), because the base
        model's has been trained further since; False: the base model's.
      num_frames: default pixel frames of a generated video.
    """

    name: str
    base: str
    dense: ForcingConfig
    sparse: ForcingConfig
    weights: str | None = None
    vae: str | None = None
    text_encoder: bool = False
    num_frames: int = 81

    def __post_init__(self):
        if (self.vae is not None or self.text_encoder) and self.weights is None:
            raise ValueError(
                f"causal preset {self.name!r} pins a VAE or text encoder but has no asset folder"
            )

    @property
    def spec(self) -> ModelSpec:
        """The base model's spec, with this preset's VAE (whose weights `ModelSpec.load_vae`
        then reads from `<weights>/vae.safetensors`) and text encoder where it pins them."""
        base = get(self.base)
        if self.text_encoder:
            base = dataclasses.replace(base, text_encoder_weights=self.weights)
        if self.vae is None:
            return base
        return dataclasses.replace(base, vae=self.vae, weights=self.weights)

    def forcing(self, attention: str, overrides: Mapping[str, Any] | None = None) -> ForcingConfig:
        """The config for `attention` ("dense" or "sparse"), with `overrides` (`--set`
        `ForcingConfig` fields) replaced."""
        if attention not in ("dense", "sparse"):
            raise ValueError(f"attention must be 'dense' or 'sparse', got {attention!r}")
        forcing = self.dense if attention == "dense" else self.sparse
        return dataclasses.replace(forcing, **overrides) if overrides else forcing

    def weights_path(self, attention: str) -> Path | None:
        """The shipped causal weights for `attention`, if any. Without trained sparse weights,
        "sparse" is the dense file: its sparse heads are still at their zero initialisation,
        which makes it the training-free Sparse Forcing model (the dense layer restricted to
        the selected blocks)."""
        if self.weights is None:
            return None
        self.forcing(attention)  # validates the name
        for name in (attention, "dense"):
            path = ASSETS / self.weights / f"{name}.safetensors"
            if path.exists():
                return path
        return None


def _causal_presets() -> dict[str, CausalPreset]:
    # The tiny preset at 64x64 pixels has 8x8 = 64 tokens per latent frame: blocks of 16 tokens
    # are two token rows (4 blocks per frame). Dense keeps sink 3 + window 15 frames (+ the
    # 3-frame chunk: 21 frames, Self-Forcing's 5 s); sparse keeps sink 3 + window 3 frames, a
    # 10-block memory and a 12-token compressed ring, i.e. 0.56x the dense peak KV, and each
    # tile of 64 queries (one frame here) attends the sink, 8 of 12 window blocks and 6 of 10
    # memory blocks.
    presets = [
        CausalPreset(
            name="tiny-causal",
            base="tiny",
            # No guidance at inference: the dense weights distil the guided teacher (guidance
            # 4, `vidax train causal --teacher-guidance 4`), so sampling needs one pass per
            # step (assets/tiny-causal/TRAINING.md); `--set guidance=G` adds CFG on top.
            dense=ForcingConfig(sink_frames=3, window_frames=15, block_size=16),
            sparse=ForcingConfig(
                sink_frames=3,
                window_frames=3,
                block_size=16,
                attention="sparse",
                memory_blocks=10,
                local_topk=8,
                memory_topk=6,
                compressed_tokens=12,
                query_tile=64,
            ),
            weights="tiny-causal",
            # Distilled from `tiny` run7 with its text encoder: nothing to pin while `tiny`
            # ships run7 (a retrained `tiny` pins it here, `text_encoder=True`).
        ),
    ]
    return {p.name: p for p in presets}


_SPECS: dict[str, ModelSpec] | None = None
_CAUSAL: dict[str, CausalPreset] | None = None


def _registry() -> tuple[dict[str, ModelSpec], dict[str, CausalPreset]]:
    # Built on first use: the presets' configs validate themselves at construction.
    global _SPECS, _CAUSAL
    if _SPECS is None or _CAUSAL is None:
        specs, causal = _specs(), _causal_presets()
        if clash := set(specs) & set(causal):  # one namespace: a clash would shadow silently
            raise ValueError(f"preset names defined twice: {sorted(clash)}")
        _SPECS, _CAUSAL = specs, causal
    return _SPECS, _CAUSAL


def names(*, causal: bool = True) -> list[str]:
    """All preset names, sorted (with `causal=False`: the text-to-video DiTs only)."""
    specs, causal_presets = _registry()
    return sorted([*specs, *(causal_presets if causal else ())])


def is_causal(name: str) -> bool:
    """Whether `name` is a causal (chunk-autoregressive) preset."""
    return name in _registry()[1]


def get(name: str) -> ModelSpec:
    """The spec of DiT preset `name`; a clear error otherwise (naming `get_causal` for a causal
    preset, and the known presets for an unknown name)."""
    specs, causal = _registry()
    if name in specs:
        return specs[name]
    if name in causal:
        raise ValueError(
            f"{name!r} is a causal (chunk-autoregressive) model: use get_causal({name!r}); "
            f"its base model is {causal[name].base!r}"
        )
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}")


def get_causal(name: str) -> CausalPreset:
    """The causal preset `name`; a clear error lists the known ones."""
    causal = _registry()[1]
    try:
        return causal[name]
    except KeyError:
        raise ValueError(
            f"unknown causal model {name!r}; known causal models: {', '.join(sorted(causal))}"
        ) from None
