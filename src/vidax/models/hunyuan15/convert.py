"""Key map: diffusers `HunyuanVideo15Transformer3DModel` safetensors <-> vidax
`HunyuanVideo15Transformer` (refiner, dual-block and head rules shared with HunyuanVideo)."""

from __future__ import annotations

import os

from vidax.checkpoint import Rule, linear_rules
from vidax.models.dit_config import load_converted
from vidax.models.hunyuan.convert import (
    dual_block_rules,
    embedder_rules,
    head_rules,
    patch_embed_rules,
    refiner_rules,
)
from vidax.models.hunyuan15.config import HunyuanVideo15Config
from vidax.models.hunyuan15.model import HunyuanVideo15Transformer


def _norm_rules(source: str, target: str) -> list[Rule]:
    return [Rule(f"{source}.weight", f"{target}.scale"), Rule(f"{source}.bias", f"{target}.bias")]


def key_map(config: HunyuanVideo15Config) -> list[Rule]:
    """Declarative map from diffusers keys to vidax parameter paths (see `vidax.checkpoint`)."""
    rules = [
        *patch_embed_rules("x_embedder.proj", "x_embedder", config),
        *embedder_rules("time_embed.timestep_embedder", "time_embedder"),
        *refiner_rules("context_embedder", "refiner"),
        *_norm_rules("context_embedder_2.norm", "byt5_embedder.norm"),
        *_norm_rules("image_embedder.norm_in", "image_embedder.norm_in"),
        *_norm_rules("image_embedder.norm_out", "image_embedder.norm_out"),
        *linear_rules("image_embedder.linear_1", "image_embedder.linear_1"),
        *linear_rules("image_embedder.linear_2", "image_embedder.linear_2"),
        Rule("cond_type_embed.weight", "cond_type_embed"),
        *dual_block_rules("transformer_blocks", "double_blocks"),
        *head_rules(),
    ]
    for i in (1, 2, 3):
        rules += linear_rules(f"context_embedder_2.linear_{i}", f"byt5_embedder.linear_{i}")
    if config.use_meanflow:
        rules += embedder_rules("time_embed.timestep_embedder_r", "time_embedder_r")
    return rules


def load(path: str | os.PathLike, config: HunyuanVideo15Config, *, mesh=None, strategy=None):
    """Builds a `HunyuanVideo15Transformer` from a diffusers checkpoint (file, index or dir)."""

    return load_converted(
        HunyuanVideo15Transformer, key_map, path, config, mesh=mesh, strategy=strategy
    )
