"""Key map: diffusers `HunyuanVideoTransformer3DModel` safetensors <-> vidax
`HunyuanVideoTransformer`.

The refiner, dual-stream block and head rules are shared with HunyuanVideo-1.5.
"""

from __future__ import annotations

import os

from vidax.checkpoint import Rule, linear_rules
from vidax.models.dit_config import load_converted
from vidax.models.hunyuan.config import HunyuanVideoConfig
from vidax.models.hunyuan.model import HunyuanVideoTransformer


def patch_embed_rules(source: str, target: str, config) -> list[Rule]:
    """Conv3d patch embedding (d, c, pt, ph, pw) <-> Linear kernel (pt*ph*pw*c, d)."""
    pt, ph, pw = config.patch_size
    c, d = config.in_channels, config.dim

    def patch_in(w):  # rows in (pt, ph, pw, c) order, as `embed` flattens patches
        return w.transpose(2, 3, 4, 1, 0).reshape(pt * ph * pw * c, d)

    def patch_in_inverse(k):
        return k.reshape(pt, ph, pw, c, d).transpose(4, 3, 0, 1, 2)

    return [
        Rule(f"{source}.weight", f"{target}.kernel", patch_in, patch_in_inverse),
        Rule(f"{source}.bias", f"{target}.bias"),
    ]


def embedder_rules(source: str, target: str) -> list[Rule]:
    """linear_1 / linear_2 of a timestep or text-projection embedder."""
    return [
        *linear_rules(f"{source}.linear_1", f"{target}.linear_1"),
        *linear_rules(f"{source}.linear_2", f"{target}.linear_2"),
    ]


def refiner_rules(source: str, target: str) -> list[Rule]:
    """`HunyuanVideoTokenRefiner` (diffusers `context_embedder`) -> `TokenRefiner`."""
    blocks = f"{source}.token_refiner.refiner_blocks.{{i}}"
    rules = [
        *embedder_rules(f"{source}.time_text_embed.timestep_embedder", f"{target}.time_embedder"),
        *embedder_rules(f"{source}.time_text_embed.text_embedder", f"{target}.pooled_embedder"),
        *linear_rules(f"{source}.proj_in", f"{target}.proj_in"),
        *linear_rules(f"{blocks}.ff.net.0.proj", f"{target}.blocks.ff.proj_in"),
        *linear_rules(f"{blocks}.ff.net.2", f"{target}.blocks.ff.proj_out"),
        *linear_rules(f"{blocks}.norm_out.linear", f"{target}.blocks.gates"),
        *linear_rules(f"{blocks}.attn.to_out.0", f"{target}.blocks.to_out"),
    ]
    for proj in ("to_q", "to_k", "to_v"):
        rules += linear_rules(f"{blocks}.attn.{proj}", f"{target}.blocks.{proj}")
    for norm in ("norm1", "norm2"):
        rules += [
            Rule(f"{blocks}.{norm}.weight", f"{target}.blocks.{norm}.scale"),
            Rule(f"{blocks}.{norm}.bias", f"{target}.blocks.{norm}.bias"),
        ]
    return rules


def dual_block_rules(source: str, target: str) -> list[Rule]:
    """`transformer_blocks.{i}` -> stacked `DualStreamBlock`s at `target`."""
    b = f"{source}.{{i}}"
    rules = [
        *linear_rules(f"{b}.norm1.linear", f"{target}.modulation"),
        *linear_rules(f"{b}.norm1_context.linear", f"{target}.modulation_context"),
        *linear_rules(f"{b}.attn.to_out.0", f"{target}.attn.to_out"),
        *linear_rules(f"{b}.attn.to_add_out", f"{target}.attn.to_add_out"),
    ]
    for proj in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
        rules += linear_rules(f"{b}.attn.{proj}", f"{target}.attn.{proj}")
    for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
        rules.append(Rule(f"{b}.attn.{norm}.weight", f"{target}.attn.{norm}.scale"))
    for ff in ("ff", "ff_context"):
        rules += linear_rules(f"{b}.{ff}.net.0.proj", f"{target}.{ff}.proj_in")
        rules += linear_rules(f"{b}.{ff}.net.2", f"{target}.{ff}.proj_out")
    return rules


def head_rules() -> list[Rule]:
    """AdaLayerNormContinuous modulation and the output projection."""
    return [*linear_rules("norm_out.linear", "norm_out"), *linear_rules("proj_out", "proj_out")]


def key_map(config: HunyuanVideoConfig) -> list[Rule]:
    """Declarative map from diffusers keys to vidax parameter paths (see `vidax.checkpoint`)."""
    s = "single_transformer_blocks.{i}"
    rules = [
        *patch_embed_rules("x_embedder.proj", "x_embedder", config),
        *embedder_rules("time_text_embed.timestep_embedder", "time_embedder"),
        *embedder_rules("time_text_embed.text_embedder", "pooled_embedder"),
        *refiner_rules("context_embedder", "refiner"),
        *dual_block_rules("transformer_blocks", "double_blocks"),
        *linear_rules(f"{s}.norm.linear", "single_blocks.modulation"),
        *linear_rules(f"{s}.proj_mlp", "single_blocks.proj_mlp"),
        *linear_rules(f"{s}.proj_out", "single_blocks.proj_out"),
        *head_rules(),
    ]
    if config.guidance_embeds:
        rules += embedder_rules("time_text_embed.guidance_embedder", "guidance_embedder")
    for proj in ("to_q", "to_k", "to_v"):
        rules += linear_rules(f"{s}.attn.{proj}", f"single_blocks.{proj}")
    for norm in ("norm_q", "norm_k"):
        rules.append(Rule(f"{s}.attn.{norm}.weight", f"single_blocks.{norm}.scale"))
    return rules


def load(path: str | os.PathLike, config: HunyuanVideoConfig, *, mesh=None, strategy=None):
    """Builds a `HunyuanVideoTransformer` from a diffusers checkpoint (file, index or directory)."""

    return load_converted(
        HunyuanVideoTransformer, key_map, path, config, mesh=mesh, strategy=strategy
    )
