"""HunyuanVideo-1.5 DiT configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from vidax.models.dit_config import diffusers_fields
from vidax.models.hunyuan.config import (
    DIFFUSERS_KEYS,
    HunyuanDiTConfigBase,
    check_dit_config,
    patch_from_diffusers,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HunyuanVideo15Config(HunyuanDiTConfigBase):
    """Architecture and numerics of a HunyuanVideo-1.5 transformer (dual-stream blocks only).

    Attributes:
      num_heads: attention heads n; head_dim: k (width d = n * k).
      num_layers: dual-stream blocks.
      num_refiner_layers: blocks of the text token refiner.
      mlp_ratio: FFN hidden f = int(d * mlp_ratio); refiner_mlp_ratio: the refiner's (fixed at 4
        in diffusers).
      in_channels: input channels c: noisy latent (32) + conditioning latent (32) + mask (1).
      out_channels: predicted latent channels.
      patch_size: (pt, ph, pw) patchification of the latent.
      text_dim / text_len: Qwen2.5-VL text embeddings (3584 wide, padded to 1000 tokens).
      byt5_dim / byt5_len: ByT5 glyph embeddings (1472 wide, 256 tokens).
      byt5_hidden: hidden width of the ByT5 projection MLP (diffusers fixes it at 2048).
      image_dim / image_len: SigLIP image embeddings (1152 wide, 729 tokens) for I2V.
      use_meanflow: embed a second timestep `timestep_r` (MeanFlow step-distilled variants).
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
    num_refiner_layers: int = 2
    mlp_ratio: float = 4.0
    refiner_mlp_ratio: float = 4.0
    in_channels: int = 65
    out_channels: int = 32
    patch_size: tuple[int, int, int] = (1, 1, 1)
    text_dim: int = 3584
    text_len: int = 1000
    byt5_dim: int = 1472
    byt5_len: int = 256
    byt5_hidden: int = 2048
    image_dim: int = 1152
    image_len: int = 729
    use_meanflow: bool = False
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
                "num_refiner_layers",
                "in_channels",
                "out_channels",
                "text_dim",
                "text_len",
                "byt5_dim",
                "byt5_len",
                "byt5_hidden",
                "image_dim",
                "image_len",
                "freq_dim",
            ),
        )


_KEYS = {
    **DIFFUSERS_KEYS,
    "text_embed_2_dim": "byt5_dim",
    "image_embed_dim": "image_dim",
    "use_meanflow": "use_meanflow",
}


def to_diffusers_config(config: HunyuanVideo15Config) -> dict:
    """The `HunyuanVideo15Transformer3DModel(**kwargs)` arguments of `config` (architecture;
    the fixed widths byt5_hidden and the token counts are not diffusers arguments)."""
    pt, ph, pw = config.patch_size
    if ph != pw:
        raise ValueError(f"diffusers patches are square, got patch_size {config.patch_size}")
    kwargs = {theirs: getattr(config, ours) for theirs, ours in _KEYS.items()}
    return dict(kwargs, rope_axes_dim=tuple(config.rope_axes_dims), patch_size=ph, patch_size_t=pt)


def from_diffusers_config(config: Mapping, **overrides) -> HunyuanVideo15Config:
    """A config from a diffusers `HunyuanVideo15Transformer3DModel` config (config.json as a
    dict); `overrides` set what a checkpoint does not say (text lengths, dtypes).

    Raises:
      ValueError: for another qk_norm, or unknown keys.
    """
    fields = diffusers_fields(
        config,
        "HunyuanVideo15Transformer3DModel",
        keys=_KEYS,
        required={"qk_norm": "rms_norm"},
        # target_size: the pipeline's default resolution; task_type: a label (the transformer
        # is the same for t2v and i2v).
        ignored=frozenset({"patch_size", "patch_size_t", "target_size", "task_type"}),
    )
    fields["patch_size"] = patch_from_diffusers(config, (1, 1, 1))
    for name, default in (("num_heads", 16), ("num_layers", 54)):
        fields.setdefault(name, default)  # diffusers' defaults (the config has none)
    return HunyuanVideo15Config(**{**fields, **overrides})


PRESETS: dict[str, HunyuanVideo15Config] = {
    # tencent/HunyuanVideo-1.5 (8.3B; the 480p/720p T2V and I2V transformers share this shape):
    # 16 x 128 = 2048 wide, 54 dual-stream blocks, patch 1, 65 -> 32 channels.
    "hunyuanvideo1.5": HunyuanVideo15Config(num_heads=16, num_layers=54),
    # Small enough to train and sample on a CPU: 16 latent channels (+16 condition + mask).
    "tiny": HunyuanVideo15Config(
        num_heads=4,
        head_dim=32,
        num_layers=2,
        num_refiner_layers=1,
        in_channels=33,
        out_channels=16,
        text_dim=64,
        text_len=32,
        byt5_dim=32,
        byt5_len=16,
        byt5_hidden=64,
        image_dim=32,
        image_len=8,
        freq_dim=64,
        rope_axes_dims=(8, 12, 12),
        dtype="float32",
        param_dtype="float32",
    ),
}
