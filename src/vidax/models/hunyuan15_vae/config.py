"""HunyuanVideo-1.5 VAE configuration and presets."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from vidax.models.dit_config import (
    CausalFrames,
    check_dtypes,
    diffusers_arguments,
    diffusers_fields,
)
from vidax.models.hunyuan_vae.config import Tiling

# The encoder runs frame 0 alone, then chunks of this many frames (one latent frame each).
ENCODE_CHUNK = 4

# diffusers' `enable_tiling()` defaults: 256 px tiles every 192 px (frozen, so shareable).
_SPATIAL_TILES = Tiling(frames=None)

# Per stage: (in channels, out channels, resampling or None). Resampling is (channels after
# it, whether it also halves / doubles time); it always halves / doubles height and width.
Stage = tuple[int, int, tuple[int, bool] | None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HunyuanVideo15VAEConfig(CausalFrames):
    """Architecture and numerics of the HunyuanVideo-1.5 VAE (`AutoencoderKLHunyuanVideo15`).

    Every layer is causal in time (causal convs, per-position RMS norms, frame-causal
    attention), so clips stream through in chunks: see `HunyuanVideo15VAE`.

    Attributes:
      in_channels / out_channels: pixel channels.
      z_dim: latent channels c (diffusers' `latent_channels`).
      block_out_channels: width of each encoder stage (the decoder mirrors them).
      layers_per_block: residual blocks per encoder stage (the decoder has one more).
      spatial_factor / temporal_factor: pixels per latent along height/width, and pixel frames
        per latent frame after the first. The first log2(spatial) stages resample space by
        pixel (un)shuffling; the last log2(temporal) of those (encoder) or the first
        log2(temporal) stages (decoder) also resample time.
      downsample_match_channel / upsample_match_channel: a resampler outputs the next stage's
        width (True) or keeps its own.
      scaling_factor: latents are scaled by it: `encode` returns mu * scaling_factor and
        `decode` divides by it first, as the diffusers pipelines do around the VAE.
      tiling: default spatial tiling of `encode`/`decode` (its `frames` must be None: time is
        streamed in causal chunks instead).
      dtype: compute dtype; param_dtype: storage dtype of parameters.
    """

    in_channels: int = 3
    out_channels: int = 3
    z_dim: int = 32
    block_out_channels: tuple[int, ...] = (128, 256, 512, 1024, 1024)
    layers_per_block: int = 2
    spatial_factor: int = 16
    temporal_factor: int = 4
    downsample_match_channel: bool = True
    upsample_match_channel: bool = True
    scaling_factor: float = 1.03682
    tiling: Tiling = _SPATIAL_TILES
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        name = type(self).__name__
        if not isinstance(self.block_out_channels, tuple):
            object.__setattr__(self, "block_out_channels", tuple(self.block_out_channels))
        for field in ("in_channels", "out_channels", "z_dim", "layers_per_block"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be positive, got {getattr(self, field)}")
        c = self.block_out_channels
        if not c or min(c) < 1:
            raise ValueError(f"block_out_channels must be positive ints, got {c}")
        for field in ("spatial_factor", "temporal_factor"):
            v = getattr(self, field)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{field} must be a power of 2, got {v}")
        if self.temporal_factor > self.spatial_factor:
            raise ValueError(
                f"temporal_factor {self.temporal_factor} exceeds spatial_factor "
                f"{self.spatial_factor}: every temporal resampler also resamples space"
            )
        if len(c) <= math.log2(self.spatial_factor):
            raise ValueError(
                f"spatial_factor {self.spatial_factor} needs more than "
                f"{int(math.log2(self.spatial_factor))} stages, got {len(c)}"
            )
        if c[-1] % (2 * self.z_dim):
            raise ValueError(
                f"the last width {c[-1]} must be a multiple of 2 * z_dim = {2 * self.z_dim}: "
                "the encoder's output shortcut averages channel groups into the moments"
            )
        for what, layout in (("encoder", self.encoder_layout), ("decoder", self.decoder_layout)):
            for i, (_, out, resample) in enumerate(layout):
                if resample is not None:
                    _check_resampler(what, i, out, *resample)
        if self.scaling_factor <= 0:
            raise ValueError(f"scaling_factor must be positive, got {self.scaling_factor}")
        if self.tiling.frames is not None:
            raise ValueError(
                "HunyuanVideo-1.5 streams time in causal chunks; its tiling must have frames=None"
            )
        self.tiling.check(self.spatial_factor, self.temporal_factor)
        check_dtypes(self)

    @property
    def encoder_layout(self) -> tuple[Stage, ...]:
        """Per down stage (diffusers' rule): (in, out, (downsampled channels, time) or None)."""
        c, width = self.block_out_channels, self.block_out_channels[0]
        stages: list[Stage] = []
        spatial = int(math.log2(self.spatial_factor))
        first_temporal = int(math.log2(self.spatial_factor // self.temporal_factor))
        for i, out in enumerate(c):
            if i < spatial:
                down = c[i + 1] if self.downsample_match_channel else out
                stages.append((width, out, (down, i >= first_temporal)))
                width = down
            else:
                stages.append((width, out, None))
                width = out
        return tuple(stages)

    @property
    def decoder_layout(self) -> tuple[Stage, ...]:
        """Per up stage (diffusers' rule): (in, out, (upsampled channels, time) or None)."""
        c = self.block_out_channels[::-1]
        stages: list[Stage] = []
        width = c[0]
        spatial, temporal = math.log2(self.spatial_factor), math.log2(self.temporal_factor)
        for i, out in enumerate(c):
            if i < spatial or i < temporal:
                up = c[i + 1] if self.upsample_match_channel else out
                stages.append((width, out, (up, i < temporal)))
                width = up
            else:
                stages.append((width, out, None))
                width = out
        return tuple(stages)


def _check_resampler(what: str, stage: int, in_dim: int, out_dim: int, temporal: bool) -> None:
    """Raises unless diffusers' pixel-(un)shuffle resampler works for these widths."""
    factor = 8 if temporal else 4
    if what == "encoder":
        ok = out_dim % factor == 0 and (factor * in_dim) % out_dim == 0
        ok = ok and (not temporal or (factor * in_dim // out_dim) % 2 == 0)
    else:
        ok = (factor * out_dim) % in_dim == 0
        ok = ok and (
            not temporal or (in_dim % factor == 0 and (factor * out_dim // in_dim) % 2 == 0)
        )
    if not ok:
        raise ValueError(
            f"{what} stage {stage}: a {'temporal' if temporal else 'spatial'} resampler from "
            f"{in_dim} to {out_dim} channels does not divide into whole channel groups"
        )


_DIFFUSERS_KEYS = {
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "latent_channels": "z_dim",
    "block_out_channels": "block_out_channels",
    "layers_per_block": "layers_per_block",
    "spatial_compression_ratio": "spatial_factor",
    "temporal_compression_ratio": "temporal_factor",
    "downsample_match_channel": "downsample_match_channel",
    "upsample_match_channel": "upsample_match_channel",
    "scaling_factor": "scaling_factor",
}


def to_diffusers_config(config: HunyuanVideo15VAEConfig) -> dict:
    """The diffusers constructor arguments of `config` (tuples as lists; tiling is a runtime
    choice in diffusers, not a config key): the inverse of `from_diffusers_config`."""
    return diffusers_arguments(config, _DIFFUSERS_KEYS)


def from_diffusers_config(config: Mapping, **overrides) -> HunyuanVideo15VAEConfig:
    """A config from a diffusers `AutoencoderKLHunyuanVideo15` config (config.json as a dict).

    Raises:
      ValueError: for keys it does not know.
    """
    fields = diffusers_fields(config, "AutoencoderKLHunyuanVideo15", keys=_DIFFUSERS_KEYS)
    return HunyuanVideo15VAEConfig(**{**fields, **overrides})


PRESETS: dict[str, HunyuanVideo15VAEConfig] = {
    # hunyuanvideo-community/HunyuanVideo-1.5 `vae/config.json` (diffusers' defaults), with
    # 256 px spatial tiles (diffusers: `enable_tiling()`).
    "hunyuanvideo15": HunyuanVideo15VAEConfig(),
    # Same topology (16x spatial, 4x temporal, five stages) and the tiny 1.5 DiT's 16 latent
    # channels, at unit-test width.
    "hunyuanvideo15-tiny": HunyuanVideo15VAEConfig(
        z_dim=16, block_out_channels=(8, 16, 16, 32, 32), layers_per_block=1
    ),
}
