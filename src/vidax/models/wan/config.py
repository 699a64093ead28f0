"""Wan 2.1 / 2.2 DiT configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from vidax.models.dit_config import PatchedVideoDiT, check_dtypes, diffusers_fields
from vidax.nn.rope import wan_axes_dims


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanConfig(PatchedVideoDiT):
    """Architecture and numerics of a Wan 2.1 / 2.2 transformer (text- or image-to-video).

    Attributes:
      dim: model width d (= num_heads * head_dim).
      num_layers: transformer blocks, stacked and scanned.
      num_heads: attention heads n.
      ffn_dim: FFN hidden width f.
      in_channels / out_channels: latent channels c; image-to-video models take more input
        channels than they output (`condition_channels`: Wan 2.1 I2V's 4 first-frame mask + 16
        image latent channels).
      text_dim: width of the text-encoder embeddings (umT5-XXL: 4096).
      text_len: number of text tokens the model is conditioned on (Wan pads to 512).
      image_dim: width of the CLIP image tokens (Wan 2.1 I2V: 1280), embedded and attended by
        every cross-attention through its own key/value projections; None: no image tokens.
      added_kv_proj_dim: input width of those key/value projections (diffusers' name; it reads
        the embedded image tokens, so it equals `dim` whenever image_dim is set).
      pos_embed_seq_len: a learned position embedding over two images' tokens (first-last-frame
        models, 2 x 257); None: none.
      expand_timesteps: image-to-video by replacing the first latent frame (Wan 2.2 TI2V,
        diffusers' pipeline flag of that name): the condition is that frame's latent plus a
        mask channel, and its tokens are held at timestep 0 (see `WanTransformer.__call__`).
      freq_dim: sinusoidal timestep features.
      patch_size: (pt, ph, pw) patchification of the latent.
      cross_attn_norm: affine LayerNorm before cross-attention.
      eps: epsilon of all norms.
      rope_theta: RoPE base.
      dtype: compute dtype; param_dtype: storage dtype of parameters.
      attention_impl: `vidax.nn.attention` implementation.
      remat: rematerialise each block in the backward pass (training).
    """

    dim: int
    num_layers: int
    num_heads: int
    ffn_dim: int
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    text_len: int = 512
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    pos_embed_seq_len: int | None = None
    expand_timesteps: bool = False
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_theta: float = 10_000.0
    dtype: str = "bfloat16"
    param_dtype: str = "bfloat16"
    attention_impl: str = "auto"
    remat: bool = False

    def __post_init__(self):
        for name in (
            "dim",
            "num_layers",
            "num_heads",
            "ffn_dim",
            "in_channels",
            "out_channels",
            "text_dim",
            "text_len",
            "freq_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"WanConfig.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if any(wan_dim % 2 for wan_dim in wan_axes_dims(self.head_dim)) or self.head_dim < 6:
            raise ValueError(
                f"head_dim {self.head_dim} cannot be split into even (t, h, w) RoPE parts"
            )
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"patch_size must be three positive ints, got {self.patch_size}")
        for name in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"WanConfig.{name} must be positive or None, got {value}")
        if (self.image_dim is None) != (self.added_kv_proj_dim is None):
            raise ValueError(
                "image_dim and added_kv_proj_dim go together (image tokens and the key/value "
                f"projections that read them), got {self.image_dim} and {self.added_kv_proj_dim}"
            )
        if self.added_kv_proj_dim is not None and self.added_kv_proj_dim != self.dim:
            raise ValueError(
                f"added_kv_proj_dim must equal dim {self.dim} (it reads the embedded image "
                f"tokens), got {self.added_kv_proj_dim}"
            )
        if self.pos_embed_seq_len is not None and self.image_dim is None:
            raise ValueError("pos_embed_seq_len needs image_dim (it embeds image tokens)")
        if self.expand_timesteps and self.in_channels != self.out_channels:
            raise ValueError(
                "expand_timesteps replaces the first latent frame: in_channels must equal "
                f"out_channels, got {self.in_channels} and {self.out_channels}"
            )
        if self.in_channels < self.out_channels:
            raise ValueError(
                f"in_channels {self.in_channels} < out_channels {self.out_channels}: the input "
                "is the latent plus optional condition channels"
            )
        if self.freq_dim % 2:
            raise ValueError(f"freq_dim must be even, got {self.freq_dim}")
        check_dtypes(self)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def rope_axes_dims(self) -> tuple[int, int, int]:
        return wan_axes_dims(self.head_dim)

    @property
    def image_channels(self) -> int:
        """Channels of an image-to-video `condition` (0: text-to-video only): Wan 2.1 / 2.2
        A14B I2V concatenate mask + image latents to the input; with `expand_timesteps`, the
        first frame's latent and a mask channel replace part of it."""
        if self.expand_timesteps:
            return self.out_channels + 1
        return self.condition_channels


def to_diffusers_config(config: WanConfig) -> dict:
    """The `WanTransformer3DModel(**kwargs)` arguments of `config` (architecture only)."""
    return dict(
        patch_size=tuple(config.patch_size),
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        text_dim=config.text_dim,
        freq_dim=config.freq_dim,
        ffn_dim=config.ffn_dim,
        num_layers=config.num_layers,
        cross_attn_norm=config.cross_attn_norm,
        eps=config.eps,
        image_dim=config.image_dim,
        added_kv_proj_dim=config.added_kv_proj_dim,
        pos_embed_seq_len=config.pos_embed_seq_len,
    )


_DIFFUSERS_KEYS = {
    "patch_size": "patch_size",
    "num_attention_heads": "num_heads",
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "text_dim": "text_dim",
    "freq_dim": "freq_dim",
    "ffn_dim": "ffn_dim",
    "num_layers": "num_layers",
    "cross_attn_norm": "cross_attn_norm",
    "eps": "eps",
    "image_dim": "image_dim",
    "added_kv_proj_dim": "added_kv_proj_dim",
    "pos_embed_seq_len": "pos_embed_seq_len",
}


def from_diffusers_config(config: Mapping, **overrides) -> WanConfig:
    """A `WanConfig` from a diffusers `WanTransformer3DModel` config (config.json as a dict);
    `overrides` set what a checkpoint does not say (text_len, dtypes).

    Raises:
      ValueError: for options this port does not implement (another qk_norm), or unknown
        keys.
    """
    required = {"qk_norm": "rms_norm_across_heads"}
    # rope_max_seq_len only sizes diffusers' precomputed frequency table: vidax computes the
    # angles of the actual positions.
    fields = diffusers_fields(
        config,
        "WanTransformer3DModel",
        keys=_DIFFUSERS_KEYS,
        required=required,
        ignored=frozenset({"attention_head_dim", "rope_max_seq_len"}),
    )
    head_dim = config.get("attention_head_dim", 128)
    fields["dim"] = fields.get("num_heads", 40) * head_dim
    fields.setdefault("num_heads", 40)
    for name, default in (("ffn_dim", 13824), ("num_layers", 40)):
        fields.setdefault(name, default)  # diffusers' defaults (WanConfig has none)
    return WanConfig(**{**fields, **overrides})


PRESETS: dict[str, WanConfig] = {
    "wan2.1-1.3b": WanConfig(dim=1536, num_layers=30, num_heads=12, ffn_dim=8960),
    "wan2.1-14b": WanConfig(dim=5120, num_layers=40, num_heads=40, ffn_dim=13824),
    # Image-to-video 14B (480p and 720p checkpoints share it): 16 latent + 4 first-frame mask
    # + 16 image-latent input channels, CLIP ViT-H/14 tokens (1280 wide).
    "wan2.1-i2v-14b": WanConfig(
        dim=5120,
        num_layers=40,
        num_heads=40,
        ffn_dim=13824,
        in_channels=36,
        image_dim=1280,
        added_kv_proj_dim=5120,
    ),
    # Wan 2.2 A14B: each expert has the 14B shape (T2V: "wan2.1-14b"); I2V without CLIP.
    "wan2.2-i2v-a14b": WanConfig(
        dim=5120, num_layers=40, num_heads=40, ffn_dim=13824, in_channels=36
    ),
    # Wan 2.2 TI2V-5B over the Wan 2.2 VAE's 48 channels.
    "wan2.2-ti2v-5b": WanConfig(
        dim=3072,
        num_layers=30,
        num_heads=24,
        ffn_dim=14336,
        in_channels=48,
        out_channels=48,
        expand_timesteps=True,
    ),
    # Tiny random-weight stand-ins of the above (tests, CLI examples) over 4-channel tiny VAEs.
    "i2v-tiny": WanConfig(
        dim=32,
        num_layers=2,
        num_heads=2,
        ffn_dim=64,
        in_channels=12,
        out_channels=4,
        text_dim=32,
        text_len=16,
        image_dim=64,
        added_kv_proj_dim=32,
        freq_dim=32,
        dtype="float32",
        param_dtype="float32",
    ),
    "t2v-tiny": WanConfig(
        dim=32,
        num_layers=2,
        num_heads=2,
        ffn_dim=64,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        text_len=16,
        freq_dim=32,
        dtype="float32",
        param_dtype="float32",
    ),
    # Small enough to train and sample on a CPU; the embedded default of `vidax generate`,
    # trained on the latents of the "shapes" VAE (8 channels) by `vidax train dit`.
    "tiny": WanConfig(
        dim=128,
        num_layers=4,
        num_heads=4,
        ffn_dim=512,
        in_channels=8,
        out_channels=8,
        text_dim=64,
        text_len=32,
        freq_dim=64,
        dtype="float32",
        param_dtype="float32",
    ),
    # The second shapes DiT (issue 16): ~8 M parameters, trained on one H200 by
    # `vidax train all --profile h200` at 32-64 px and 1-33 frames, conditioned by a trained
    # `vidax.models.word_encoder.WordEncoder` (text_dim = its width).
    "tiny-v2": WanConfig(
        dim=256,
        num_layers=8,
        num_heads=4,
        ffn_dim=768,
        in_channels=8,
        out_channels=8,
        text_dim=256,
        text_len=32,
        freq_dim=128,
        dtype="float32",
        param_dtype="float32",
    ),
}
PRESETS["ti2v-tiny"] = dataclasses.replace(PRESETS["t2v-tiny"], expand_timesteps=True)
