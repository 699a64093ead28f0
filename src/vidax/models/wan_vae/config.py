"""Wan 2.1 / Wan 2.2 VAE configuration and presets."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from vidax.models.dit_config import CausalFrames, check_dtypes

# How `CausalConv3d` computes a 3D convolution: "native", one 3D convolution; "2d-sum", the sum
# of kt 2D convolutions over shifted frames. XLA:CPU has no fast path for 3D convolutions: there
# a 3x3x3 conv runs ~4x faster forward and ~7x faster backward as the sum. The function is the
# same up to float summation order, so weights trained either way are the same model.
CONV_IMPLS = ("native", "2d-sum")

# The encoder always runs frame 0 alone, then chunks of this many frames (as diffusers does), so
# videos have 1 + 4k frames and at most two of the downsampling stages may halve time.
ENCODE_CHUNK = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanVAEConfig(CausalFrames):
    """Architecture and numerics of the Wan causal 3D VAE (diffusers `AutoencoderKLWan`).

    Wan 2.1's VAE is the default; Wan 2.2's (TI2V-5B) sets `is_residual` and `patch_size`.

    Attributes:
      base_dim: encoder width of the first stage; stage i has base_dim * dim_mult[i] channels.
      decoder_base_dim: decoder base width (None: same as base_dim).
      z_dim: latent channels c.
      dim_mult: channel multipliers per stage; len(dim_mult) - 1 stages halve height and width.
      num_res_blocks: residual blocks per encoder stage (the decoder has one more).
      attn_scales: spatial scales (1, 0.5, ...) at which encoder stages add attention after each
        residual block. The diffusers decoder ignores them, so ours does too; the residual
        encoder has no attention, so they must be empty with `is_residual`.
      temperal_downsample: per downsampling stage, whether it also halves time (diffusers'
        spelling); the decoder mirrors it. At most two may be True.
      in_channels / out_channels: channels entering the encoder and leaving the decoder, as in
        diffusers: the video's channels times patch_size**2 (`video_in_channels` /
        `video_out_channels` are the video's).
      is_residual: Wan 2.2's stages: each encoder stage adds its input averaged down to its
        output's shape, each decoder up stage its input repeated up to its output's, and the
        decoder's upsamplers keep their channels.
      patch_size: Wan 2.2's pixel patches: p x p pixels become p * p channels before the
        encoder and after the decoder, so the spatial compression is 2**(len(dim_mult) - 1) * p.
        None: no patches.
      latents_mean / latents_std: per-channel latent statistics; `encode` returns
        (mu - mean) / std and `decode` inverts it. None means 0 / 1 (no normalisation).
      dtype: compute dtype; param_dtype: storage dtype of parameters.
      conv_impl: how the causal 3D convolutions are computed (`CONV_IMPLS`): numerics only,
        not part of the checkpoint.
    """

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    in_channels: int = 3
    out_channels: int = 3
    is_residual: bool = False
    patch_size: int | None = None
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    conv_impl: str = "native"

    def __post_init__(self):
        # Accept lists (e.g. straight from a diffusers config.json) but store hashable tuples.
        for name in (
            "dim_mult",
            "attn_scales",
            "temperal_downsample",
            "latents_mean",
            "latents_std",
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        for name in ("base_dim", "z_dim", "num_res_blocks", "in_channels", "out_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"WanVAEConfig.{name} must be positive, got {getattr(self, name)}")
        if self.decoder_base_dim is not None and self.decoder_base_dim < 1:
            raise ValueError(
                f"WanVAEConfig.decoder_base_dim must be positive, got {self.decoder_base_dim}"
            )
        if not self.dim_mult or any(m < 1 for m in self.dim_mult):
            raise ValueError(
                f"dim_mult must be a non-empty tuple of positive ints, got {self.dim_mult}"
            )
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"temperal_downsample has {len(self.temperal_downsample)} entries but dim_mult "
                f"{self.dim_mult} has {len(self.dim_mult) - 1} downsampling stages"
            )
        if sum(map(bool, self.temperal_downsample)) > 2:
            raise ValueError(
                f"at most 2 stages may downsample time (the encoder runs {ENCODE_CHUNK}-frame "
                f"chunks), got temperal_downsample={self.temperal_downsample}"
            )
        if self.patch_size is not None:
            p2 = self.patch_size**2
            if self.patch_size < 1:
                raise ValueError(f"patch_size must be positive or None, got {self.patch_size}")
            for name in ("in_channels", "out_channels"):
                if getattr(self, name) % p2:
                    raise ValueError(
                        f"{name}={getattr(self, name)} must be a multiple of patch_size**2={p2}: "
                        f"the video's channels times the {p2} pixels of a patch (e.g. {3 * p2})"
                    )
        if self.is_residual:
            self._check_residual_shortcuts()
        scales = self.encoder_scales
        for s in self.attn_scales:
            if s not in scales:
                raise ValueError(
                    f"attn_scales entry {s} matches no encoder stage; stage scales are {scales}"
                )
        for name in ("latents_mean", "latents_std"):
            value = getattr(self, name)
            if value is not None and len(value) != self.z_dim:
                raise ValueError(f"{name} has {len(value)} values, expected z_dim={self.z_dim}")
        if self.latents_std is not None and any(s <= 0 for s in self.latents_std):
            raise ValueError(f"latents_std must be positive, got {self.latents_std}")
        check_dtypes(self)
        if self.conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")

    def _check_residual_shortcuts(self) -> None:
        """Raises ValueError where a residual stage's shortcut cannot reach its output shape."""
        if self.attn_scales:
            raise ValueError(
                f"attn_scales={self.attn_scales} with is_residual: the residual (Wan 2.2) encoder "
                "has no attention blocks"
            )
        # A down shortcut averages groups of in * factor / out values; an up shortcut repeats
        # each input channel out * factor / in times.
        for in_dim, out_dim, mode in self.encoder_stages:
            factor = _resample_factor(mode)
            if in_dim * factor % out_dim:
                raise ValueError(
                    f"residual encoder stage {in_dim} -> {out_dim} channels: {in_dim} x {factor} "
                    f"(its downsampling) is not divisible by {out_dim}; change dim_mult"
                )
        for in_dim, out_dim, mode in self.decoder_layout:
            factor = _resample_factor(mode)
            if mode is not None and out_dim * factor % in_dim:
                raise ValueError(
                    f"residual decoder stage {in_dim} -> {out_dim} channels: {out_dim} x {factor} "
                    f"(its upsampling) is not divisible by {in_dim}; change dim_mult"
                )

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent along height and width (patch_size included)."""
        return 2 ** (len(self.dim_mult) - 1) * (self.patch_size or 1)

    @property
    def video_in_channels(self) -> int:
        """Channels of the videos `encode` takes."""
        return self.in_channels // (self.patch_size or 1) ** 2

    @property
    def video_out_channels(self) -> int:
        """Channels of the videos `decode` returns."""
        return self.out_channels // (self.patch_size or 1) ** 2

    @property
    def temporal_factor(self) -> int:
        """Pixel frames per latent frame after the first."""
        return 2 ** sum(map(bool, self.temperal_downsample))

    @property
    def encoder_dims(self) -> tuple[int, ...]:
        """Channels entering each encoder stage, then the last stage's output."""
        return tuple(self.base_dim * m for m in (1, *self.dim_mult))

    @property
    def decoder_dims(self) -> tuple[int, ...]:
        """Channels of the decoder's middle block, then each up stage's output."""
        base = self.decoder_base_dim or self.base_dim
        return tuple(base * m for m in (self.dim_mult[-1], *self.dim_mult[::-1]))

    @property
    def encoder_stages(self) -> tuple[tuple[int, int, str | None], ...]:
        """Each encoder stage as (in channels, out channels, downsample mode or None)."""
        last = len(self.dim_mult) - 1
        return tuple(
            (in_dim, out_dim, None if i == last else _mode("down", self.temperal_downsample[i]))
            for i, (in_dim, out_dim) in enumerate(itertools.pairwise(self.encoder_dims))
        )

    @property
    def decoder_layout(self) -> tuple[tuple[int, int, str | None], ...]:
        """The decoder's up stages as (in channels, out channels, upsample mode or None)."""
        temporal_up = self.temperal_downsample[::-1]
        last = len(self.dim_mult) - 1
        blocks = []
        for i, (in_dim, out_dim) in enumerate(itertools.pairwise(self.decoder_dims)):
            # Wan 2.1: every up stage but the first follows an upsample that halved the channels.
            if i > 0 and not self.is_residual:
                in_dim //= 2
            blocks.append((in_dim, out_dim, None if i == last else _mode("up", temporal_up[i])))
        return tuple(blocks)

    @property
    def encoder_scales(self) -> tuple[float, ...]:
        """Spatial scale (1, 0.5, ...) of each encoder stage, matched against attn_scales."""
        return tuple(0.5**i for i in range(len(self.dim_mult)))


def _mode(direction: str, temporal: bool) -> str:
    """The `Resample` mode of a stage resampling 2x in space and, if `temporal`, in time."""
    return f"{direction}sample{'3d' if temporal else '2d'}"


def _resample_factor(mode: str | None) -> int:
    """Values per value a stage's resampling merges (down) or spreads (up): 1, 4 or 8."""
    if mode is None:
        return 1
    return 8 if mode.endswith("3d") else 4


# diffusers `AutoencoderKLWan` keys that do not change the architecture or are derived.
# `clip_output` is written by diffusers' Wan 2.2 conversion script (False in the
# Wan2.2-TI2V-5B config) but AutoencoderKLWan takes no such argument: diffusers 0.42 ignores it
# and always clamps decoded pixels to [-1, 1], as `WanVAE.decode` does.
_DIFFUSERS_IGNORED = {"dropout", "scale_factor_temporal", "scale_factor_spatial", "clip_output"}
_DIFFUSERS_KEYS = {
    "base_dim",
    "decoder_base_dim",
    "z_dim",
    "dim_mult",
    "num_res_blocks",
    "attn_scales",
    "temperal_downsample",
    "in_channels",
    "out_channels",
    "is_residual",
    "patch_size",
    "latents_mean",
    "latents_std",
}


def to_diffusers_config(config: WanVAEConfig) -> dict:
    """The `AutoencoderKLWan(**kwargs)` arguments of `config` (lists for tuples; unset latent
    statistics and patch size left out): the inverse of `from_diffusers_config`.

    The scale factors are included: diffusers' tiling reads them instead of deriving them.
    """
    kwargs = {k: getattr(config, k) for k in sorted(_DIFFUSERS_KEYS)}
    kwargs["scale_factor_spatial"] = config.spatial_factor
    kwargs["scale_factor_temporal"] = config.temporal_factor
    return {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items() if v is not None}


def from_diffusers_config(config: Mapping, **overrides) -> WanVAEConfig:
    """A `WanVAEConfig` from a diffusers `AutoencoderKLWan` config (its config.json as a dict),
    Wan 2.1's or Wan 2.2's (`is_residual`, `patch_size`).

    Raises:
      ValueError: keys it does not know, or an inconsistent config (see `WanVAEConfig`).
    """
    unknown = {
        k for k in config if not k.startswith("_") and k not in _DIFFUSERS_KEYS | _DIFFUSERS_IGNORED
    }
    if unknown:
        raise ValueError(f"unknown AutoencoderKLWan config keys {sorted(unknown)}")
    kwargs = {k: v for k, v in config.items() if k in _DIFFUSERS_KEYS}
    z_dim = overrides.get("z_dim", kwargs.get("z_dim", 16))
    for name, default in (("latents_mean", _WAN21_MEAN), ("latents_std", _WAN21_STD)):
        # diffusers keeps its Wan 2.1 defaults even when z_dim differs (only pipelines use
        # them); such statistics describe no latent of this model, so drop them.
        value = kwargs.get(name)
        if value is not None and len(value) != z_dim and tuple(value) == default:
            kwargs[name] = None
    return WanVAEConfig(**{**kwargs, **overrides})


# fmt: off
_WAN21_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
_WAN21_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)
# Wan 2.2 (TI2V-5B): `vae22_diffusers_config` of diffusers' scripts/convert_wan_to_diffusers.py,
# as in the Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json.
_WAN22_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
_WAN22_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)
# fmt: on

PRESETS: dict[str, WanVAEConfig] = {
    "wan2.1": WanVAEConfig(latents_mean=_WAN21_MEAN, latents_std=_WAN21_STD),
    # The Wan2.2-TI2V-5B VAE: 2x2-pixel patches and 8x downsampling (16x16 pixels per latent),
    # 4x in time, 48 latent channels, residual stages, a wider decoder.
    "wan2.2-vae": WanVAEConfig(
        base_dim=160,
        decoder_base_dim=256,
        z_dim=48,
        in_channels=12,
        out_channels=12,
        is_residual=True,
        patch_size=2,
        latents_mean=_WAN22_MEAN,
        latents_std=_WAN22_STD,
    ),
    # Wan 2.2's topology (patches, residual stages, 16x spatial, 4x temporal, a decoder stage
    # that halves its channels) at a width that runs in unit tests.
    "wan2.2-tiny": WanVAEConfig(
        base_dim=4,
        decoder_base_dim=6,
        z_dim=4,
        num_res_blocks=1,
        in_channels=12,
        out_channels=12,
        is_residual=True,
        patch_size=2,
        latents_mean=(0.1, -0.2, 0.3, 0.0),
        latents_std=(1.5, 0.5, 2.0, 1.0),
    ),
    # Same topology (8x spatial, 4x temporal) at a width that runs in unit tests.
    "tiny": WanVAEConfig(
        base_dim=8,
        z_dim=4,
        dim_mult=(1, 2, 2, 2),
        latents_mean=(0.1, -0.2, 0.3, 0.0),
        latents_std=(1.5, 0.5, 2.0, 1.0),
    ),
    # The VAE of the shipped `tiny` text-to-video model (vidax/assets/tiny/TRAINING.md): Wan's
    # 4x temporal compression, 4x spatial (33x64x64 pixels -> 9x16x16 latents), 8 latent
    # channels, a wider decoder than encoder. First trained by `vidax train vae` on
    # `vidax.data.shapes` clips, then fine-tuned at 32-64 px and 1-33 frames by the VAE stage of
    # `vidax train all` (vidax/assets/tiny); latents_mean/std are that stage's
    # `latent_stats.json` (256 fresh 33-frame clips).
    "shapes": WanVAEConfig(
        base_dim=8,
        decoder_base_dim=16,
        z_dim=8,
        dim_mult=(1, 2, 4),
        num_res_blocks=1,
        temperal_downsample=(True, True),
        latents_mean=(0.1933, -0.8087, 0.6968, 0.4564, 0.5279, -0.6088, -0.6009, -0.0308),
        latents_std=(1.7284, 1.612, 2.0492, 1.4772, 1.3804, 1.2709, 1.694, 1.443),
    ),
}
# The `shapes` VAE of the first `tiny` DiT (`tiny-v1`, shipped until 2026-12-06; weights in git
# history), before the VAE stage of `vidax train all` fine-tuned it.
PRESETS["shapes-v1.5"] = dataclasses.replace(
    PRESETS["shapes"],
    latents_mean=(1.3311, -1.4097, 1.3888, -0.0058, 0.5029, -1.2145, -1.0271, 0.9443),
    latents_std=(2.3954, 2.157, 3.0568, 1.9215, 1.9691, 1.601, 2.4137, 2.0697),
)
# The first `shapes` VAE (trained on 9-frame clips only, 2026-12-02), whose latents the shipped
# `tiny-causal` models were trained on (vidax/assets/tiny-causal/vae.safetensors).
PRESETS["shapes-v1"] = dataclasses.replace(
    PRESETS["shapes"],
    latents_mean=(1.2686, -1.769, 0.6872, -0.488, 0.2484, -0.2557, -1.9036, -0.9786),
    latents_std=(2.9232, 2.8848, 3.8874, 2.7634, 2.5532, 1.9476, 4.8112, 2.5532),
)
