"""Key map between diffusers `AutoencoderKLHunyuanVideo` checkpoints and `HunyuanVideoVAE`.

Layouts: torch Conv3d (out, in, kt, kh, kw) <-> (kt, kh, kw, in, out); Linear (out, in) <->
(in, out); GroupNorm weight/bias <-> scale/bias. Module paths mirror diffusers except that the
`.conv` inside each causal conv wrapper is dropped, `downsamplers.0` / `upsamplers.0` become
`resampler` and `to_out.0` becomes `to_out`.
"""

from __future__ import annotations

import os

from jax.sharding import Mesh

from vidax.checkpoint import Rule
from vidax.checkpoint.keymap import linear_rules
from vidax.models.hunyuan_vae.config import PRESETS, HunyuanVideoVAEConfig
from vidax.models.hunyuan_vae.model import HunyuanVideoVAE
from vidax.models.vae_convert import conv_rules, load_vae, save_vae


def _norm(source: str, target: str) -> list[Rule]:
    return [Rule(f"{source}.weight", f"{target}.scale"), Rule(f"{source}.bias", f"{target}.bias")]


def _resnet(prefix: str, in_dim: int, out_dim: int) -> list[Rule]:
    rules = [
        *_norm(f"{prefix}.norm1", f"{prefix}.norm1"),
        *conv_rules(f"{prefix}.conv1.conv", f"{prefix}.conv1"),
        *_norm(f"{prefix}.norm2", f"{prefix}.norm2"),
        *conv_rules(f"{prefix}.conv2.conv", f"{prefix}.conv2"),
    ]
    if in_dim != out_dim:
        rules += conv_rules(f"{prefix}.conv_shortcut.conv", f"{prefix}.conv_shortcut")
    return rules


def _mid(prefix: str, attend: bool) -> list[Rule]:
    rules = [*_resnet(f"{prefix}.resnets.0", 1, 1), *_resnet(f"{prefix}.resnets.1", 1, 1)]
    if attend:
        attn = f"{prefix}.attentions.0"
        rules += _norm(f"{attn}.group_norm", f"{attn}.group_norm")
        for name in ("to_q", "to_k", "to_v"):
            rules += linear_rules(f"{attn}.{name}", f"{attn}.{name}")
        rules += linear_rules(f"{attn}.to_out.0", f"{attn}.to_out")
    return rules


def _coder(
    prefix: str, layout, num: int, resampler: str, config: HunyuanVideoVAEConfig
) -> list[Rule]:
    rules = [
        *conv_rules(f"{prefix}.conv_in.conv", f"{prefix}.conv_in"),
        *_mid(f"{prefix}.mid_block", config.mid_block_add_attention),
        *_norm(f"{prefix}.conv_norm_out", f"{prefix}.conv_norm_out"),
        *conv_rules(f"{prefix}.conv_out.conv", f"{prefix}.conv_out"),
    ]
    for i, (in_dim, out_dim, factors) in enumerate(layout):
        stage = f"{prefix}.{'down' if prefix == 'encoder' else 'up'}_blocks.{i}"
        for j in range(num):
            rules += _resnet(f"{stage}.resnets.{j}", in_dim if j == 0 else out_dim, out_dim)
        if factors != (1, 1):
            rules += conv_rules(f"{stage}.{resampler}.0.conv.conv", f"{stage}.resampler.conv")
    return rules


def key_map(config: HunyuanVideoVAEConfig) -> list[Rule]:
    """The diffusers <-> vidax rules covering every `HunyuanVideoVAE(config)` parameter once."""
    return [
        *_coder("encoder", config.encoder_layout, config.layers_per_block, "downsamplers", config),
        *_coder(
            "decoder", config.decoder_layout, config.layers_per_block + 1, "upsamplers", config
        ),
        *conv_rules("quant_conv", "quant_conv"),
        *conv_rules("post_quant_conv", "post_quant_conv"),
    ]


def load(
    path: str | os.PathLike,
    config: HunyuanVideoVAEConfig | str,
    *,
    mesh: Mesh | None = None,
    strategy=None,
) -> HunyuanVideoVAE:
    """Builds a `HunyuanVideoVAE` from a diffusers-layout checkpoint (args: `vae_convert.load_vae`)."""
    return load_vae(HunyuanVideoVAE, PRESETS, key_map, path, config, mesh=mesh, strategy=strategy)


def save(vae: HunyuanVideoVAE, path: str | os.PathLike, **kwargs) -> None:
    """Writes `vae` as a diffusers-layout safetensors file (kwargs: see `save_model`)."""
    save_vae(vae, key_map, path, **kwargs)
