"""Geometry and dtypes every patchified video DiT config derives the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp


class PatchedVideoDiT:
    """Derived properties of a DiT config dataclass with the fields `patch_size` (pt, ph, pw),
    `in_channels`, `out_channels`, `dtype` and `param_dtype`."""

    @property
    def patch_features(self) -> int:
        """Features of one input patch token before the embedding."""
        pt, ph, pw = self.patch_size
        return pt * ph * pw * self.in_channels

    @property
    def out_features(self) -> int:
        """Features of one output patch token before unpatchify."""
        pt, ph, pw = self.patch_size
        return pt * ph * pw * self.out_channels

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

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


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value
