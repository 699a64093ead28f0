"""HunyuanVideo (1.0) VAE configuration, tiling settings and presets."""

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tiling:
    """How `encode`/`decode` split a video into overlapping tiles (diffusers' scheme).

    The HunyuanVideo VAE normalises with GroupNorm over whole clips and attends over all of a
    clip's latent positions, so a clip cannot be streamed through it chunk by chunk with a cache
    (unlike Wan's). Tiles bound memory instead: each tile is encoded or decoded on its own and
    neighbouring outputs are cross-faded over their overlap.

    Attributes:
      size: spatial tile height and width in pixels, a multiple of the spatial factor; frames
        larger than this are tiled. None disables spatial tiling.
      stride: pixels between spatial tiles (blended over `size - stride` pixels).
      frames: temporal tile length in pixel frames, a multiple of the temporal factor; clips of
        more frames (decode: more than `frames / temporal_factor` latent frames) are tiled, each
        tile reaching one latent frame further. None disables temporal tiling.
      frames_stride: pixel frames between temporal tiles (blended over `frames - frames_stride`).
    """

    size: int | None = 256
    stride: int = 192
    frames: int | None = 16
    frames_stride: int = 12

    def __post_init__(self):
        for name, value, step in (
            ("size", self.size, self.stride),
            ("frames", self.frames, self.frames_stride),
        ):
            if value is None:
                continue
            if step < 1 or value < 1:
                raise ValueError(f"Tiling.{name} and its stride must be positive, got {self}")
            if step > value:
                raise ValueError(f"Tiling.{name}={value} is smaller than its stride {step}")

    def check(self, spatial_factor: int, temporal_factor: int) -> None:
        """Raises ValueError unless every size is a multiple of the VAE's factors."""
        if self.size is not None and (self.size % spatial_factor or self.stride % spatial_factor):
            raise ValueError(
                f"tile size {self.size} and stride {self.stride} must be multiples of the "
                f"spatial factor {spatial_factor}"
            )
        if self.frames is not None and (
            self.frames % temporal_factor or self.frames_stride % temporal_factor
        ):
            raise ValueError(
                f"tile frames {self.frames} and frames_stride {self.frames_stride} must be "
                f"multiples of the temporal factor {temporal_factor}"
            )


# Whole clips in one pass: diffusers with `use_framewise_*` off and tiling disabled.
NO_TILING = Tiling(size=None, frames=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HunyuanVideoVAEConfig(CausalFrames):
    """Architecture and numerics of the HunyuanVideo VAE (diffusers `AutoencoderKLHunyuanVideo`).

    Attributes:
      in_channels / out_channels: pixel channels.
      z_dim: latent channels c (diffusers' `latent_channels`).
      block_out_channels: width of each encoder stage (the decoder mirrors them).
      layers_per_block: residual blocks per encoder stage (the decoder has one more).
      norm_num_groups: GroupNorm groups; divides every width.
      spatial_factor / temporal_factor: pixels per latent along height/width, and pixel frames
        per latent frame after the first. Which stages resample follows diffusers' rule from
        these (the first log2(spatial) stages halve space, the two before the last halve time).
      mid_block_add_attention: frame-causal self-attention in the middle blocks.
      scaling_factor: latents are scaled by it: `encode` returns mu * scaling_factor and
        `decode` divides by it first, as the diffusers pipelines do around the VAE.
      tiling: default tiling of `encode`/`decode` (overridable per call).
      dtype: compute dtype; param_dtype: storage dtype of parameters.
    """

    in_channels: int = 3
    out_channels: int = 3
    z_dim: int = 16
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    norm_num_groups: int = 32
    spatial_factor: int = 8
    temporal_factor: int = 4
    mid_block_add_attention: bool = True
    scaling_factor: float = 0.476986
    tiling: Tiling = Tiling()
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        if not isinstance(self.block_out_channels, tuple):
            object.__setattr__(self, "block_out_channels", tuple(self.block_out_channels))
        for name in ("in_channels", "out_channels", "z_dim", "layers_per_block", "norm_num_groups"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"HunyuanVideoVAEConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if not self.block_out_channels or min(self.block_out_channels) < 1:
            raise ValueError(
                f"block_out_channels must be positive ints, got {self.block_out_channels}"
            )
        for c in self.block_out_channels:
            if c % self.norm_num_groups:
                raise ValueError(
                    f"norm_num_groups={self.norm_num_groups} does not divide width {c} of "
                    f"block_out_channels {self.block_out_channels}"
                )
        if self.spatial_factor < 1 or self.spatial_factor & (self.spatial_factor - 1):
            raise ValueError(f"spatial_factor must be a power of 2, got {self.spatial_factor}")
        if self.temporal_factor != 4:
            # diffusers' decoder implements only 4x temporal compression.
            raise ValueError(f"temporal_factor must be 4, got {self.temporal_factor}")
        got = (
            math.prod(s for _, _, (_, s) in self.encoder_layout),
            math.prod(t for _, _, (t, _) in self.encoder_layout),
        )
        if got != (self.spatial_factor, self.temporal_factor):
            raise ValueError(
                f"{len(self.block_out_channels)} stages give {got[0]}x spatial and {got[1]}x "
                f"temporal compression, not {self.spatial_factor}x / {self.temporal_factor}x; "
                "use more stages"
            )
        if self.scaling_factor <= 0:
            raise ValueError(f"scaling_factor must be positive, got {self.scaling_factor}")
        self.tiling.check(self.spatial_factor, self.temporal_factor)
        check_dtypes(self)

    def _stage_factors(self, i: int) -> tuple[int, int]:
        """(temporal, spatial) resampling factor of stage i, by diffusers' rule."""
        n = len(self.block_out_channels)
        spatial = i < int(math.log2(self.spatial_factor))
        temporal = i >= n - 1 - int(math.log2(self.temporal_factor)) and i != n - 1
        return (2 if temporal else 1, 2 if spatial else 1)

    @property
    def encoder_layout(self) -> tuple[tuple[int, int, tuple[int, int]], ...]:
        """Per down stage: (in channels, out channels, (temporal, spatial) downsampling)."""
        c = self.block_out_channels
        return tuple((c[max(i - 1, 0)], c[i], self._stage_factors(i)) for i in range(len(c)))

    @property
    def decoder_layout(self) -> tuple[tuple[int, int, tuple[int, int]], ...]:
        """Per up stage: (in channels, out channels, (temporal, spatial) upsampling)."""
        c = self.block_out_channels[::-1]
        return tuple((c[max(i - 1, 0)], c[i], self._stage_factors(i)) for i in range(len(c)))


_DIFFUSERS_KEYS = {
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "latent_channels": "z_dim",
    "block_out_channels": "block_out_channels",
    "layers_per_block": "layers_per_block",
    "norm_num_groups": "norm_num_groups",
    "spatial_compression_ratio": "spatial_factor",
    "temporal_compression_ratio": "temporal_factor",
    "mid_block_add_attention": "mid_block_add_attention",
    "scaling_factor": "scaling_factor",
}


def to_diffusers_config(config: HunyuanVideoVAEConfig) -> dict:
    """The diffusers constructor arguments of `config` (tuples as lists; tiling is a runtime
    choice in diffusers, not a config key): the inverse of `from_diffusers_config`."""
    return diffusers_arguments(config, _DIFFUSERS_KEYS)


def from_diffusers_config(config: Mapping, **overrides) -> HunyuanVideoVAEConfig:
    """A config from a diffusers `AutoencoderKLHunyuanVideo` config (its config.json as a dict).

    Raises:
      ValueError: for block types or activations this port does not implement, or unknown keys.
    """
    for key, allowed in (
        ("down_block_types", "HunyuanVideoDownBlock3D"),
        ("up_block_types", "HunyuanVideoUpBlock3D"),
    ):
        bad = [b for b in config.get(key, ()) if b != allowed]
        if bad:
            raise ValueError(f"{key} {bad} are not supported (only {allowed})")
        if key in config and len(config[key]) != len(config.get("block_out_channels", (0,) * 4)):
            raise ValueError(f"{key} must have one entry per block_out_channels entry")
    if config.get("act_fn", "silu") not in ("silu", "swish"):
        raise ValueError(f"act_fn={config['act_fn']!r} is not supported (only silu)")
    fields = diffusers_fields(
        config,
        "AutoencoderKLHunyuanVideo",
        keys=_DIFFUSERS_KEYS,
        ignored=frozenset({"down_block_types", "up_block_types", "act_fn"}),
    )
    return HunyuanVideoVAEConfig(**{**fields, **overrides})


PRESETS: dict[str, HunyuanVideoVAEConfig] = {
    # hunyuanvideo-community/HunyuanVideo `vae/config.json` (diffusers' defaults). Spatial tiling
    # at 256 px is on, as HunyuanVideo's own sampler enables it (diffusers: `enable_tiling()`).
    "hunyuanvideo": HunyuanVideoVAEConfig(),
    # Same topology (8x spatial, 4x temporal, four stages) and the tiny DiT's 16 latent channels,
    # at a width that runs in unit tests. Not called plain "tiny": VAE presets of all families
    # share one namespace in `vidax.models.get_vae`, where Wan's "tiny" lives.
    "hunyuanvideo-tiny": HunyuanVideoVAEConfig(
        z_dim=16,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
    ),
}
