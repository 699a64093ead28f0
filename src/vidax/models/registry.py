"""One registry of model presets: what to build, how to load it, and how to sample it.

`get(name)` returns a `ModelSpec`; the CLI, the pipeline and the benchmarks use nothing else to
find models. A spec names its transformer family and config, the VAE and text encoder it pairs
with, and the sampling defaults of its reference implementation.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flax import nnx

# family -> module implementing: <Config class>, PRESETS, the model class, key_map, load.
_FAMILIES = {
    "wan": ("vidax.models.wan", "WanTransformer"),
    "hunyuanvideo": ("vidax.models.hunyuan", "HunyuanVideoTransformer"),
    "hunyuanvideo15": ("vidax.models.hunyuan15", "HunyuanVideo15Transformer"),
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
    # Solver fields beyond the shift (e.g. UniPC's order), as read from a checkpoint's scheduler.
    solver_options: tuple[tuple[str, Any], ...] = ()

    def solver(self, *, sampler: str | None = None, steps: int | None = None, shift=None):
        """The `vidax.sampling` solver of these defaults, any of them overridden (the
        `solver_options` apply to the default sampler only)."""
        from vidax import sampling

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
      text_config: for the "hashed" text encoder, the `vidax.text.encoder.WordEncoderConfig`
        of a trained encoder over the hashed word vectors (weights `text_encoder.safetensors`
        beside the transformer's); None: the hashed vectors go to the DiT as they are.
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

    @property
    def module(self) -> type[nnx.Module]:
        path, cls = _FAMILIES[self.family]
        return getattr(importlib.import_module(path), cls)

    @property
    def loader(self) -> Callable:
        """`load(path, config, *, mesh=None, strategy=None)` of the family."""
        return importlib.import_module(_FAMILIES[self.family][0]).load

    @property
    def vae_spec(self) -> VAESpec | None:
        """The VAE this model decodes with (None: latents only)."""
        if self.vae is None or isinstance(self.vae, VAESpec):
            return self.vae
        return get_vae(self.vae)

    @property
    def vae_name(self) -> str | None:
        return self.vae if self.vae is None or isinstance(self.vae, str) else self.vae.name

    def build(self, *, seed: int = 0, config=None) -> nnx.Module:
        """A randomly initialised transformer (use `loader` for real weights)."""
        return self.module(config or self.config, rngs=nnx.Rngs(seed))

    def with_config(self, **changes) -> ModelSpec:
        """A copy with transformer-config fields replaced (validated by the config)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))

    def num_params(self) -> int:
        abstract = nnx.eval_shape(lambda: self.build())
        return sum(math.prod(v.shape) for v in _leaves(nnx.state(abstract, nnx.Param)))


def _leaves(state):
    import jax

    return jax.tree.leaves(state)


def _specs() -> dict[str, ModelSpec]:
    from vidax.models.wan import PRESETS as WAN
    from vidax.text.encoder import WordEncoderConfig

    specs = [
        ModelSpec(
            name="tiny",
            family="wan",
            config=WAN["tiny"],
            vae="shapes",
            text_encoder="hashed",
            weights="tiny",
            # Trained on 33-frame clips (9x16x16 latents); see vidax/assets/tiny/TRAINING.md.
            defaults=SamplingDefaults(
                num_frames=33, height=64, width=64, steps=20, shift=3.0, guidance=4.0, fps=8
            ),
            # Its spatial DVG stages drop caption adherence 0.72 -> 0.01 (docs/dvg.md §6.1).
            dvg_spatial=False,
        ),
        ModelSpec(
            name="tiny-v2",
            family="wan",
            config=WAN["tiny-v2"],
            vae="shapes",
            text_encoder="hashed",
            text_config=WordEncoderConfig(in_dim=128, dim=256, num_layers=3, text_len=32),
            defaults=SamplingDefaults(
                num_frames=33, height=64, width=64, steps=20, shift=3.0, guidance=4.0, fps=8
            ),
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
        try:
            presets = importlib.import_module(_FAMILIES[family][0]).PRESETS
        except ImportError:  # family not installed in this build
            continue
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
    return {s.name: s for s in specs}


# VAE families: module implementing <PRESETS>, the model class, and load(path, config).
_VAE_FAMILIES = {
    "wan": ("vidax.models.wan_vae", "WanVAE"),
    "hunyuan": ("vidax.models.hunyuan_vae", "HunyuanVideoVAE"),
    "hunyuan15": ("vidax.models.hunyuan15_vae", "HunyuanVideo15VAE"),
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
    def module(self) -> type[nnx.Module]:
        path, cls = _VAE_FAMILIES[self.family]
        return getattr(importlib.import_module(path), cls)

    @property
    def loader(self) -> Callable:
        return importlib.import_module(_VAE_FAMILIES[self.family][0]).load

    def build(self, *, seed: int = 0) -> nnx.Module:
        return self.module(self.config, rngs=nnx.Rngs(seed))


def get_vae(name: str) -> VAESpec:
    """The VAE preset `name` from any VAE family; a clear error lists the known presets."""
    known: dict[str, tuple[str, Any]] = {}
    for family, (path, _) in _VAE_FAMILIES.items():
        presets = importlib.import_module(path).PRESETS
        for preset, config in presets.items():
            if preset in known:  # one namespace for all families: a clash would shadow silently
                raise ValueError(
                    f"VAE preset {preset!r} is defined by {known[preset][0]!r} and {family!r}"
                )
            known[preset] = (family, config)
    if name not in known:
        raise ValueError(f"unknown VAE {name!r}; known VAEs: {', '.join(sorted(known))}")
    family, config = known[name]
    return VAESpec(name=name, family=family, config=config)


_CACHE: dict[str, ModelSpec] | None = None


def names() -> list[str]:
    """All preset names, sorted."""
    return sorted(_registry())


def _registry() -> dict[str, ModelSpec]:
    global _CACHE
    if _CACHE is None:
        _CACHE = _specs()
    return _CACHE


def get(name: str) -> ModelSpec:
    """The spec of preset `name`; a clear error lists the known presets otherwise."""
    try:
        return _registry()[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(names())}") from None
