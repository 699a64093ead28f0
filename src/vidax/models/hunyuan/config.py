"""HunyuanVideo DiT configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from vidax.models.dit_config import PatchedVideoDiT, check_dtypes, diffusers_fields


def check_dit_config(config, positive: tuple[str, ...]) -> None:
    """Validation shared by the HunyuanVideo 1 and 1.5 configs; raises ValueError.

    Checks the named fields are positive, the RoPE split covers the head dim with even parts,
    the patch is three positive ints, and the dtypes are known.
    """
    name = type(config).__name__
    for field in positive:
        if getattr(config, field) < 1:
            raise ValueError(f"{name}.{field} must be positive, got {getattr(config, field)}")
    for field in ("mlp_ratio", "refiner_mlp_ratio"):
        if getattr(config, field) <= 0:
            raise ValueError(f"{name}.{field} must be positive, got {getattr(config, field)}")
    dims = config.rope_axes_dims
    if len(dims) != 3 or any(d < 2 or d % 2 for d in dims):
        raise ValueError(f"rope_axes_dims must be three positive even ints, got {dims}")
    if sum(dims) != config.head_dim:
        raise ValueError(
            f"rope_axes_dims {dims} must sum to head_dim {config.head_dim} (RoPE spans the head)"
        )
    if len(config.patch_size) != 3 or min(config.patch_size) < 1:
        raise ValueError(f"patch_size must be three positive ints, got {config.patch_size}")
    if config.freq_dim % 2:
        raise ValueError(f"freq_dim must be even, got {config.freq_dim}")
    check_dtypes(config)


class HunyuanDiTConfigBase(PatchedVideoDiT):
    """Derived sizes shared by the HunyuanVideo 1 and 1.5 configs (dataclasses with the fields
    num_heads, head_dim, mlp_ratio, refiner_mlp_ratio, in/out_channels, patch_size, dtypes)."""

    num_heads: int
    head_dim: int
    mlp_ratio: float
    refiner_mlp_ratio: float

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def mlp_dim(self) -> int:
        return int(self.dim * self.mlp_ratio)

    @property
    def refiner_mlp_dim(self) -> int:
        return int(self.dim * self.refiner_mlp_ratio)

    @property
    def latent_channels(self) -> int:
        """Channels of the latent being denoised (the input may add condition channels)."""
        return self.out_channels


@dataclasses.dataclass(frozen=True, kw_only=True)
class HunyuanVideoConfig(HunyuanDiTConfigBase):
    """Architecture and numerics of a HunyuanVideo (1.0) transformer.

    Attributes:
      num_heads: attention heads n; head_dim: k (width d = n * k).
      num_layers: dual-stream blocks (separate video and text weights, joint attention).
      num_single_layers: single-stream blocks (one weight set over [video; text] tokens).
      num_refiner_layers: blocks of the text token refiner.
      mlp_ratio: FFN hidden f = int(d * mlp_ratio).
      refiner_mlp_ratio: the same for the token refiner (diffusers fixes it at 4).
      in_channels / out_channels: latent channels c (I2V concatenates the image latent: 33).
      patch_size: (pt, ph, pw) patchification of the latent.
      text_dim: width of the LLM text embeddings (LLaVA-Llama-3: 4096).
      text_len: text tokens the pipeline pads to (256).
      pooled_dim: width of the pooled CLIP embedding (768).
      guidance_embeds: embed the (distilled) guidance scale as a second timestep.
      freq_dim: sinusoidal timestep features.
      rope_axes_dims: head-dim split of the (t, h, w) RoPE, summing to head_dim.
      rope_theta: RoPE base.
      eps: epsilon of the norms in the blocks, the refiner and the output head.
      dtype: compute dtype; param_dtype: storage dtype of parameters.
      attention_impl: `vidax.nn.attention` implementation.
      remat: rematerialise each block in the backward pass (training).
    """

    num_heads: int
    head_dim: int = 128
    num_layers: int
    num_single_layers: int
    num_refiner_layers: int = 2
    mlp_ratio: float = 4.0
    refiner_mlp_ratio: float = 4.0
    in_channels: int = 16
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_dim: int = 4096
    text_len: int = 256
    pooled_dim: int = 768
    guidance_embeds: bool = True
    freq_dim: int = 256
    rope_axes_dims: tuple[int, int, int] = (16, 56, 56)
    rope_theta: float = 256.0
    eps: float = 1e-6
    dtype: str = "bfloat16"
    param_dtype: str = "bfloat16"
    attention_impl: str = "auto"
    remat: bool = False

    def __post_init__(self):
        check_dit_config(
            self,
            (
                "num_heads",
                "head_dim",
                "num_layers",
                "num_single_layers",
                "num_refiner_layers",
                "in_channels",
                "out_channels",
                "text_dim",
                "text_len",
                "pooled_dim",
                "freq_dim",
            ),
        )


# diffusers key -> field, shared by the HunyuanVideo 1 and 1.5 transformers.
DIFFUSERS_KEYS = {
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "num_attention_heads": "num_heads",
    "attention_head_dim": "head_dim",
    "num_layers": "num_layers",
    "num_refiner_layers": "num_refiner_layers",
    "mlp_ratio": "mlp_ratio",
    "text_embed_dim": "text_dim",
    "rope_theta": "rope_theta",
    "rope_axes_dim": "rope_axes_dims",
}


def patch_from_diffusers(config: Mapping, default: tuple[int, int, int]) -> tuple[int, int, int]:
    """(pt, ph, pw) from diffusers' `patch_size_t` and square `patch_size`."""
    size = config.get("patch_size", default[1])
    return (config.get("patch_size_t", default[0]), size, size)


def to_diffusers_config(config: HunyuanVideoConfig) -> dict:
    """The `HunyuanVideoTransformer3DModel(**kwargs)` arguments of `config` (architecture)."""
    pt, ph, pw = config.patch_size
    if ph != pw:
        raise ValueError(f"diffusers patches are square, got patch_size {config.patch_size}")
    return dict(
        {theirs: getattr(config, ours) for theirs, ours in DIFFUSERS_KEYS.items()},
        rope_axes_dim=tuple(config.rope_axes_dims),
        num_single_layers=config.num_single_layers,
        patch_size=ph,
        patch_size_t=pt,
        guidance_embeds=config.guidance_embeds,
        pooled_projection_dim=config.pooled_dim,
    )


def from_diffusers_config(config: Mapping, **overrides) -> HunyuanVideoConfig:
    """A config from a diffusers `HunyuanVideoTransformer3DModel` config (config.json as a
    dict); `overrides` set what a checkpoint does not say (text_len, dtypes).

    Raises:
      ValueError: for options this port does not implement (image conditioning, another
        qk_norm), or unknown keys.
    """
    fields = diffusers_fields(
        config,
        "HunyuanVideoTransformer3DModel",
        keys={
            **DIFFUSERS_KEYS,
            "num_single_layers": "num_single_layers",
            "guidance_embeds": "guidance_embeds",
            "pooled_projection_dim": "pooled_dim",
        },
        required={"qk_norm": "rms_norm", "image_condition_type": None},
        ignored=frozenset({"patch_size", "patch_size_t"}),
    )
    fields["patch_size"] = patch_from_diffusers(config, (1, 2, 2))
    for name, default in (("num_heads", 24), ("num_layers", 20), ("num_single_layers", 40)):
        fields.setdefault(name, default)  # diffusers' defaults (the config has none)
    return HunyuanVideoConfig(**{**fields, **overrides})


PRESETS: dict[str, HunyuanVideoConfig] = {
    # tencent/HunyuanVideo (T2V, 13B): 24 x 128 = 3072 wide, 20 dual + 40 single blocks.
    "hunyuanvideo": HunyuanVideoConfig(num_heads=24, num_layers=20, num_single_layers=40),
    # Small enough to train and sample on a CPU.
    "tiny": HunyuanVideoConfig(
        num_heads=4,
        head_dim=32,
        num_layers=2,
        num_single_layers=2,
        num_refiner_layers=1,
        text_dim=64,
        text_len=32,
        pooled_dim=64,
        freq_dim=64,
        rope_axes_dims=(8, 12, 12),
        dtype="float32",
        param_dtype="float32",
    ),
}
