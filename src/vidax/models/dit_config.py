"""Geometry and dtypes every patchified video DiT config derives the same way, and the dtype
check of every model config (DiTs, VAEs, text and image encoders)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from vidax.checkpoint import Rule, load_model

Model = TypeVar("Model", bound=nnx.Module)

# The dtype names a config's `dtype` / `param_dtype` may take.
DTYPES = ("float32", "bfloat16", "float16")


def check_dtypes(config: Any, allowed: tuple[str, ...] = DTYPES) -> None:
    """Checks a config dataclass's `dtype` and `param_dtype` fields name `allowed` dtypes.

    Raises:
      ValueError: naming the config class, the field, the allowed names and the value.
    """
    for field in ("dtype", "param_dtype"):
        value = getattr(config, field)
        if value not in allowed:
            raise ValueError(
                f"{type(config).__name__}.{field} must be one of {allowed}, got {value!r}"
            )


class ConfigDtypes:
    """The dtypes of a config dataclass with the string fields `dtype` (compute) and
    `param_dtype` (storage)."""

    # Declared for the type checker; the config dataclass defines them (a non-dataclass base's
    # annotations are not fields).
    dtype: str
    param_dtype: str

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)


class CausalFrames:
    """Frame counts of a causal video VAE config with a `temporal_factor`: frame 0 is encoded
    alone, then every `temporal_factor` frames make one latent frame."""

    if TYPE_CHECKING:  # the config defines it, as a field or a property

        @property
        def temporal_factor(self) -> int: ...

    def latent_frames(self, frames: int) -> int:
        """Latent frames t for a video of `frames` = 1 + 4k pixel frames."""
        return 1 + (frames - 1) // self.temporal_factor

    def video_frames(self, latent_frames: int) -> int:
        """Pixel frames decoded from `latent_frames` latent frames."""
        return 1 + (latent_frames - 1) * self.temporal_factor


class PatchedVideoDiT(ConfigDtypes):
    """Derived properties of a DiT config dataclass with the fields `patch_size` (pt, ph, pw),
    `in_channels`, `out_channels`, `dtype` and `param_dtype`."""

    patch_size: tuple[int, int, int]
    in_channels: int
    out_channels: int

    @property
    def patch_features(self) -> int:
        """Features of one input patch token before the embedding."""
        pt, ph, pw = self.patch_size
        return pt * ph * pw * self.in_channels

    @property
    def condition_channels(self) -> int:
        """Input channels beside the latent: an image-to-video model's condition (image
        latents, first-frame mask), concatenated to the noisy latent (`VideoDiT.__call__`)."""
        return self.in_channels - self.out_channels

    @property
    def out_features(self) -> int:
        """Features of one output patch token before unpatchify."""
        pt, ph, pw = self.patch_size
        return pt * ph * pw * self.out_channels

    def num_tokens(self, latent_frames: int, latent_height: int, latent_width: int) -> int:
        """Tokens of a (t, h, w) latent after patchify."""
        pt, ph, pw = self.patch_size
        return (latent_frames // pt) * (latent_height // ph) * (latent_width // pw)


def diffusers_fields(
    config: Mapping[str, Any],
    class_name: str,
    *,
    keys: Mapping[str, str],
    required: Mapping[str, Any] | None = None,
    ignored: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Our config fields from a diffusers `config.json` (as a dict).

    Args:
      config: the diffusers config; keys starting with "_" (class name, versions) are skipped.
      class_name: the diffusers class, for error messages.
      keys: diffusers key -> our field name.
      required: diffusers key -> the only value this port implements (absent keys pass).
      ignored: keys that do not change the model (e.g. defaults a pipeline reads).

    Raises:
      ValueError: a required key has another value, or a key is unknown: nothing a checkpoint
        says is dropped silently.
    """
    required = required or {}
    for key, value in required.items():
        if key in config and config[key] != value:
            raise ValueError(
                f"{class_name} with {key}={config[key]!r} is not supported (only {value!r})"
            )
    unknown = sorted(
        k for k in config if not k.startswith("_") and k not in {*keys, *required, *ignored}
    )
    if unknown:
        raise ValueError(f"unknown {class_name} config keys {unknown}")
    return {ours: _tuple(config[theirs]) for theirs, ours in keys.items() if theirs in config}


def diffusers_arguments(config: Any, keys: Mapping[str, str]) -> dict[str, Any]:
    """The diffusers constructor arguments `keys` (diffusers key -> our field) name, read from
    `config`, tuples as lists: the inverse of `diffusers_fields`."""
    kwargs = {theirs: getattr(config, ours) for theirs, ours in keys.items()}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}


def load_converted(
    cls: Callable[..., Model],
    key_map: Callable[[Any], list[Rule]],
    path: str | os.PathLike,
    config: Any,
    *,
    mesh: Mesh | None = None,
    strategy=None,
    ignore: Iterable[str] = (),
) -> Model:
    """Builds `cls(config)` straight from a diffusers-layout checkpoint: every family's loader.

    Args:
      cls: the model class, built as `cls(config, rngs=...)`.
      key_map: config -> the rules covering every parameter once.
      path: a safetensors file, index, or directory.
      mesh / strategy: optional placement of every parameter (see `vidax.checkpoint`).
      ignore: checkpoint keys that are not parameters of `cls`.

    Raises:
      CheckpointError: naming every missing, unexpected or mis-shaped key.
    """
    return load_model(
        lambda: cls(config, rngs=nnx.Rngs(0)),
        path,
        key_map(config),
        mesh=mesh,
        strategy=strategy,
        ignore=ignore,
    )


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value
