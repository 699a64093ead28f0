"""Key map between diffusers `AutoencoderKLHunyuanVideo15` checkpoints and `HunyuanVideo15VAE`.

Layouts: torch Conv3d (out, in, kt, kh, kw) <-> (kt, kh, kw, in, out), the attention's 1x1x1
projections included; RMS norm gamma (c, 1, 1, 1) <-> (c,). Module paths mirror diffusers except
that the `.conv` inside each causal conv wrapper is dropped and `downsamplers.0` /
`upsamplers.0` become `resampler`.
"""

from __future__ import annotations

import os

from jax.sharding import Mesh

from vidax.checkpoint import Rule
from vidax.models.hunyuan15_vae.config import PRESETS, HunyuanVideo15VAEConfig
from vidax.models.hunyuan15_vae.model import HunyuanVideo15VAE
from vidax.models.vae_convert import GAMMA_VIDEO, conv_rules, load_vae, save_vae


def _norm(source: str, target: str) -> list[Rule]:
    return [Rule(f"{source}.gamma", f"{target}.gamma", **GAMMA_VIDEO)]


def _resnet(prefix: str, in_dim: int, out_dim: int) -> list[Rule]:
    rules = [
        *_norm(f"{prefix}.norm1", f"{prefix}.norm1"),
        *conv_rules(f"{prefix}.conv1.conv", f"{prefix}.conv1"),
        *_norm(f"{prefix}.norm2", f"{prefix}.norm2"),
        *conv_rules(f"{prefix}.conv2.conv", f"{prefix}.conv2"),
    ]
    if in_dim != out_dim:  # a plain nn.Conv3d in diffusers, not a causal wrapper
        rules += conv_rules(f"{prefix}.conv_shortcut", f"{prefix}.conv_shortcut")
    return rules


def _mid(prefix: str) -> list[Rule]:
    attn = f"{prefix}.attentions.0"
    rules = [*_resnet(f"{prefix}.resnets.0", 1, 1), *_resnet(f"{prefix}.resnets.1", 1, 1)]
    rules += _norm(f"{attn}.norm", f"{attn}.norm")
    for name in ("to_q", "to_k", "to_v", "proj_out"):
        rules += conv_rules(f"{attn}.{name}", f"{attn}.{name}")
    return rules


def _coder(prefix: str, blocks: str, layout, num: int, resampler: str) -> list[Rule]:
    rules = [
        *conv_rules(f"{prefix}.conv_in.conv", f"{prefix}.conv_in"),
        *_mid(f"{prefix}.mid_block"),
        *_norm(f"{prefix}.norm_out", f"{prefix}.norm_out"),
        *conv_rules(f"{prefix}.conv_out.conv", f"{prefix}.conv_out"),
    ]
    for i, (in_dim, out_dim, resample) in enumerate(layout):
        stage = f"{prefix}.{blocks}.{i}"
        for j in range(num):
            rules += _resnet(f"{stage}.resnets.{j}", in_dim if j == 0 else out_dim, out_dim)
        if resample is not None:
            rules += conv_rules(f"{stage}.{resampler}.0.conv.conv", f"{stage}.resampler.conv")
    return rules


def key_map(config: HunyuanVideo15VAEConfig) -> list[Rule]:
    """The diffusers <-> vidax rules covering every `HunyuanVideo15VAE(config)` parameter once."""
    n = config.layers_per_block
    return [
        *_coder("encoder", "down_blocks", config.encoder_layout, n, "downsamplers"),
        *_coder("decoder", "up_blocks", config.decoder_layout, n + 1, "upsamplers"),
    ]


def load(
    path: str | os.PathLike,
    config: HunyuanVideo15VAEConfig | str,
    *,
    mesh: Mesh | None = None,
    strategy=None,
) -> HunyuanVideo15VAE:
    """Builds a `HunyuanVideo15VAE` from a diffusers-layout checkpoint (args: `vae_convert.load_vae`)."""
    return load_vae(HunyuanVideo15VAE, PRESETS, key_map, path, config, mesh=mesh, strategy=strategy)


def save(vae: HunyuanVideo15VAE, path: str | os.PathLike, **kwargs) -> None:
    """Writes `vae` as a diffusers-layout safetensors file (kwargs: see `save_model`)."""
    save_vae(vae, key_map, path, **kwargs)
