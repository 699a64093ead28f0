"""Geometry and dtypes every patchified video DiT config derives the same way."""

from __future__ import annotations

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
