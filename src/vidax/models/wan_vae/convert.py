"""Key map between diffusers `AutoencoderKLWan` checkpoints and `WanVAE`, and loading.

Layouts (see `vidax.models.vae_convert`): Conv3d, Conv2d, RMS norm gamma (c, 1, 1, 1) or, in
attention, (c, 1, 1).
Module paths mirror diffusers except `resample.1` -> `conv` (the Conv2d inside a torch
Sequential) and, in Wan 2.1's decoder, `upsamplers.0` -> `upsampler`. Wan 2.2's residual stages
(`encoder.down_blocks.i.{resnets.j, downsampler}`, `decoder.up_blocks.i.{resnets.j, upsampler}`)
keep diffusers' names; their shortcuts have no parameters.
"""

from __future__ import annotations

import os

from jax.sharding import Mesh

from vidax.checkpoint import Rule
from vidax.models.vae_convert import (
    CONV2D,
    CONV3D,
    GAMMA_IMAGE,
    GAMMA_VIDEO,
    conv_rules,
    load_vae,
    save_vae,
)
from vidax.models.wan_vae.config import PRESETS, WanVAEConfig
from vidax.models.wan_vae.model import WanVAE, encoder_layout


def _residual(prefix: str, in_dim: int, out_dim: int) -> list[Rule]:
    rules = [
        Rule(f"{prefix}.norm1.gamma", f"{prefix}.norm1.gamma", **GAMMA_VIDEO),
        *conv_rules(f"{prefix}.conv1", f"{prefix}.conv1", CONV3D),
        Rule(f"{prefix}.norm2.gamma", f"{prefix}.norm2.gamma", **GAMMA_VIDEO),
        *conv_rules(f"{prefix}.conv2", f"{prefix}.conv2", CONV3D),
    ]
    if in_dim != out_dim:
        rules += conv_rules(f"{prefix}.conv_shortcut", f"{prefix}.conv_shortcut", CONV3D)
    return rules


def _attention(prefix: str) -> list[Rule]:
    return [
        Rule(f"{prefix}.norm.gamma", f"{prefix}.norm.gamma", **GAMMA_IMAGE),
        *conv_rules(f"{prefix}.to_qkv", f"{prefix}.to_qkv", CONV2D),
        *conv_rules(f"{prefix}.proj", f"{prefix}.proj", CONV2D),
    ]


def _resample(source: str, target: str, mode: str) -> list[Rule]:
    rules = conv_rules(f"{source}.resample.1", f"{target}.conv", CONV2D)
    if mode.endswith("3d"):
        rules += conv_rules(f"{source}.time_conv", f"{target}.time_conv", CONV3D)
    return rules


def _stage(prefix: str, num: int, in_dim: int, out_dim: int) -> list[Rule]:
    """The `num` residual blocks `{prefix}.resnets.j` of a stage from in_dim to out_dim."""
    rules = []
    for j in range(num):
        rules += _residual(f"{prefix}.resnets.{j}", in_dim if j == 0 else out_dim, out_dim)
    return rules


def _mid(prefix: str) -> list[Rule]:
    return [
        *_residual(f"{prefix}.resnets.0", 1, 1),
        *_attention(f"{prefix}.attentions.0"),
        *_residual(f"{prefix}.resnets.1", 1, 1),
    ]


def _head(prefix: str) -> list[Rule]:
    return [
        *conv_rules(f"{prefix}.conv_in", f"{prefix}.conv_in", CONV3D),
        *_mid(f"{prefix}.mid_block"),
        Rule(f"{prefix}.norm_out.gamma", f"{prefix}.norm_out.gamma", **GAMMA_VIDEO),
        *conv_rules(f"{prefix}.conv_out", f"{prefix}.conv_out", CONV3D),
    ]


def key_map(config: WanVAEConfig) -> list[Rule]:
    """The diffusers <-> vidax rules covering every `WanVAE(config)` parameter exactly once."""
    rules = [
        *_head("encoder"),
        *_head("decoder"),
        *conv_rules("quant_conv", "quant_conv", CONV3D),
        *conv_rules("post_quant_conv", "post_quant_conv", CONV3D),
    ]
    if config.is_residual:
        for i, (in_dim, out_dim, mode) in enumerate(config.encoder_stages):
            prefix = f"encoder.down_blocks.{i}"
            rules += _stage(prefix, config.num_res_blocks, in_dim, out_dim)
            if mode is not None:
                rules += _resample(f"{prefix}.downsampler", f"{prefix}.downsampler", mode)
    else:
        for n, (kind, *sizes) in enumerate(encoder_layout(config)):
            prefix = f"encoder.down_blocks.{n}"
            if kind == "res":
                rules += _residual(prefix, *sizes)
            elif kind == "attn":
                rules += _attention(prefix)
            else:
                rules += _resample(prefix, prefix, kind)
    # Wan 2.1's upsampler sits in a one-element ModuleList, Wan 2.2's does not.
    upsampler = "upsampler" if config.is_residual else "upsamplers.0"
    for i, (in_dim, out_dim, mode) in enumerate(config.decoder_layout):
        prefix = f"decoder.up_blocks.{i}"
        rules += _stage(prefix, config.num_res_blocks + 1, in_dim, out_dim)
        if mode is not None:
            rules += _resample(f"{prefix}.{upsampler}", f"{prefix}.upsampler", mode)
    return rules


def load(
    path: str | os.PathLike, config: WanVAEConfig | str, *, mesh: Mesh | None = None, strategy=None
) -> WanVAE:
    """Builds a `WanVAE` from a diffusers-layout checkpoint (args: `vae_convert.load_vae`)."""
    return load_vae(WanVAE, PRESETS, key_map, path, config, mesh=mesh, strategy=strategy)


def save(vae: WanVAE, path: str | os.PathLike, **kwargs) -> None:
    """Writes `vae` as a diffusers-layout safetensors file (kwargs: see `save_model`)."""
    save_vae(vae, key_map, path, **kwargs)
