"""Key map between diffusers `AutoencoderKLWan` checkpoints and `WanVAE`, and loading.

Layouts: torch Conv3d (out, in, kt, kh, kw) <-> (kt, kh, kw, in, out); Conv2d (out, in, kh, kw)
<-> (kh, kw, in, out); RMS norm gamma (c, 1, 1, 1) or, in attention, (c, 1, 1) <-> (c,).
Module paths mirror diffusers except `resample.1` -> `conv` (the Conv2d inside a torch
Sequential) and `upsamplers.0` -> `upsampler`.
"""

from __future__ import annotations

import os

from flax import nnx
from jax.sharding import Mesh

from vidax.checkpoint import Rule, load_model, save_model
from vidax.models.wan_vae.config import PRESETS, WanVAEConfig
from vidax.models.wan_vae.model import WanVAE, decoder_layout, encoder_layout


def _conv3d_to_jax(w):
    return w.transpose(2, 3, 4, 1, 0)


def _conv3d_to_torch(w):
    return w.transpose(4, 3, 0, 1, 2)


def _conv2d_to_jax(w):
    return w.transpose(2, 3, 1, 0)


def _conv2d_to_torch(w):
    return w.transpose(3, 2, 0, 1)


def _flatten(g):
    return g.reshape(-1)


def _gamma_3d(g):
    return g.reshape(-1, 1, 1, 1)


def _gamma_2d(g):
    return g.reshape(-1, 1, 1)


CONV3D = {"transform": _conv3d_to_jax, "inverse": _conv3d_to_torch}
CONV2D = {"transform": _conv2d_to_jax, "inverse": _conv2d_to_torch}
GAMMA_VIDEO = {"transform": _flatten, "inverse": _gamma_3d}  # images=False norms
GAMMA_IMAGE = {"transform": _flatten, "inverse": _gamma_2d}  # attention norms (per frame)


def _conv(source: str, target: str, layout: dict) -> list[Rule]:
    return [
        Rule(f"{source}.weight", f"{target}.kernel", **layout),
        Rule(f"{source}.bias", f"{target}.bias"),
    ]


def _residual(prefix: str, in_dim: int, out_dim: int) -> list[Rule]:
    rules = [
        Rule(f"{prefix}.norm1.gamma", f"{prefix}.norm1.gamma", **GAMMA_VIDEO),
        *_conv(f"{prefix}.conv1", f"{prefix}.conv1", CONV3D),
        Rule(f"{prefix}.norm2.gamma", f"{prefix}.norm2.gamma", **GAMMA_VIDEO),
        *_conv(f"{prefix}.conv2", f"{prefix}.conv2", CONV3D),
    ]
    if in_dim != out_dim:
        rules += _conv(f"{prefix}.conv_shortcut", f"{prefix}.conv_shortcut", CONV3D)
    return rules


def _attention(prefix: str) -> list[Rule]:
    return [
        Rule(f"{prefix}.norm.gamma", f"{prefix}.norm.gamma", **GAMMA_IMAGE),
        *_conv(f"{prefix}.to_qkv", f"{prefix}.to_qkv", CONV2D),
        *_conv(f"{prefix}.proj", f"{prefix}.proj", CONV2D),
    ]


def _resample(source: str, target: str, mode: str) -> list[Rule]:
    rules = _conv(f"{source}.resample.1", f"{target}.conv", CONV2D)
    if mode.endswith("3d"):
        rules += _conv(f"{source}.time_conv", f"{target}.time_conv", CONV3D)
    return rules


def _mid(prefix: str) -> list[Rule]:
    return [
        *_residual(f"{prefix}.resnets.0", 1, 1),
        *_attention(f"{prefix}.attentions.0"),
        *_residual(f"{prefix}.resnets.1", 1, 1),
    ]


def _head(prefix: str) -> list[Rule]:
    return [
        *_conv(f"{prefix}.conv_in", f"{prefix}.conv_in", CONV3D),
        *_mid(f"{prefix}.mid_block"),
        Rule(f"{prefix}.norm_out.gamma", f"{prefix}.norm_out.gamma", **GAMMA_VIDEO),
        *_conv(f"{prefix}.conv_out", f"{prefix}.conv_out", CONV3D),
    ]


def key_map(config: WanVAEConfig) -> list[Rule]:
    """The diffusers <-> vidax rules covering every `WanVAE(config)` parameter exactly once."""
    rules = [
        *_head("encoder"),
        *_head("decoder"),
        *_conv("quant_conv", "quant_conv", CONV3D),
        *_conv("post_quant_conv", "post_quant_conv", CONV3D),
    ]
    for n, (kind, *sizes) in enumerate(encoder_layout(config)):
        prefix = f"encoder.down_blocks.{n}"
        if kind == "res":
            rules += _residual(prefix, *sizes)
        elif kind == "attn":
            rules += _attention(prefix)
        else:
            rules += _resample(prefix, prefix, kind)
    for i, (in_dim, out_dim, mode) in enumerate(decoder_layout(config)):
        prefix = f"decoder.up_blocks.{i}"
        for j in range(config.num_res_blocks + 1):
            rules += _residual(f"{prefix}.resnets.{j}", in_dim if j == 0 else out_dim, out_dim)
        if mode is not None:
            rules += _resample(f"{prefix}.upsamplers.0", f"{prefix}.upsampler", mode)
    return rules


def load(
    path: str | os.PathLike,
    config: WanVAEConfig | str,
    *,
    mesh: Mesh | None = None,
    strategy=None,
) -> WanVAE:
    """Builds a `WanVAE` straight from a diffusers-layout safetensors checkpoint.

    Args:
      path: a safetensors file, index, or directory (e.g. a diffusers `vae/` folder).
      config: a `WanVAEConfig` or a `PRESETS` name.
      mesh / strategy: optional placement of every parameter (see `vidax.checkpoint`).

    Raises:
      CheckpointError: naming every missing, unexpected or mis-shaped key.
    """
    if isinstance(config, str):
        try:
            config = PRESETS[config]
        except KeyError:
            raise ValueError(
                f"unknown WanVAE preset {config!r}; choose from {sorted(PRESETS)}"
            ) from None
    return load_model(
        lambda: WanVAE(config, rngs=nnx.Rngs(0)),
        path,
        key_map(config),
        mesh=mesh,
        strategy=strategy,
    )


def save(vae: WanVAE, path: str | os.PathLike, **kwargs) -> None:
    """Writes `vae` as a diffusers-layout safetensors file (kwargs: see `save_model`)."""
    save_model(vae, path, key_map(vae.config), **kwargs)
