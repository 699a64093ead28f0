"""Key map: diffusers `WanTransformer3DModel` safetensors <-> vidax `WanTransformer`."""

from __future__ import annotations

import os

from vidax.checkpoint import Rule, linear_rules
from vidax.models.dit_config import load_converted
from vidax.models.wan.config import WanConfig
from vidax.models.wan.model import WanTransformer

# Present in some exported checkpoints but unused by the architecture (diffusers ignores it too).
IGNORED = ("blocks.*.attn2.norm_added_q.weight",)


def key_map(config: WanConfig) -> list[Rule]:
    """Declarative map from diffusers keys to vidax parameter paths (see `vidax.checkpoint`)."""
    pt, ph, pw = config.patch_size
    d, c = config.dim, config.in_channels

    def patch_in(w):  # Conv3d (d, c, pt, ph, pw) -> Linear (pt*ph*pw*c, d), rows in (pt, ph, pw, c)
        return w.transpose(2, 3, 4, 1, 0).reshape(pt * ph * pw * c, d)

    def patch_in_inverse(k):
        return k.reshape(pt, ph, pw, c, d).transpose(4, 3, 0, 1, 2)

    def table(w):  # (1, k, d) -> (k, d)
        return w.reshape(w.shape[1:])

    def table_inverse(w):
        return w.reshape(1, *w.shape)

    rules = [
        Rule("patch_embedding.weight", "patch_embedding.kernel", patch_in, patch_in_inverse),
        Rule("patch_embedding.bias", "patch_embedding.bias"),
        *linear_rules("condition_embedder.time_embedder.linear_1", "time_embedder.linear_1"),
        *linear_rules("condition_embedder.time_embedder.linear_2", "time_embedder.linear_2"),
        *linear_rules("condition_embedder.time_proj", "time_proj"),
        *linear_rules("condition_embedder.text_embedder.linear_1", "text_embedder.linear_1"),
        *linear_rules("condition_embedder.text_embedder.linear_2", "text_embedder.linear_2"),
        *linear_rules("proj_out", "proj_out"),
        Rule("scale_shift_table", "scale_shift_table", table, table_inverse),
        Rule("blocks.{i}.scale_shift_table", "blocks.scale_shift_table", table, table_inverse),
        *linear_rules("blocks.{i}.ffn.net.0.proj", "blocks.ffn.proj_in"),
        *linear_rules("blocks.{i}.ffn.net.2", "blocks.ffn.proj_out"),
    ]
    if config.image_dim is not None:  # image-to-video: CLIP tokens, their keys and values
        emb = "condition_embedder.image_embedder"
        rules += [
            Rule(f"{emb}.norm1.weight", "image_embedder.norm1.scale"),
            Rule(f"{emb}.norm1.bias", "image_embedder.norm1.bias"),
            *linear_rules(f"{emb}.ff.net.0.proj", "image_embedder.proj_in"),
            *linear_rules(f"{emb}.ff.net.2", "image_embedder.proj_out"),
            Rule(f"{emb}.norm2.weight", "image_embedder.norm2.scale"),
            Rule(f"{emb}.norm2.bias", "image_embedder.norm2.bias"),
            *linear_rules("blocks.{i}.attn2.add_k_proj", "blocks.attn2.add_k_proj"),
            *linear_rules("blocks.{i}.attn2.add_v_proj", "blocks.attn2.add_v_proj"),
            Rule("blocks.{i}.attn2.norm_added_k.weight", "blocks.attn2.norm_added_k.scale"),
        ]
        if config.pos_embed_seq_len is not None:
            rules.append(Rule(f"{emb}.pos_embed", "image_embedder.pos_embed", table, table_inverse))
    if config.cross_attn_norm:
        rules += [
            Rule("blocks.{i}.norm2.weight", "blocks.norm2.scale"),
            Rule("blocks.{i}.norm2.bias", "blocks.norm2.bias"),
        ]
    for attn in ("attn1", "attn2"):
        for src, dst in (
            ("to_q", "to_q"),
            ("to_k", "to_k"),
            ("to_v", "to_v"),
            ("to_out.0", "to_out"),
        ):
            rules += linear_rules(f"blocks.{{i}}.{attn}.{src}", f"blocks.{attn}.{dst}")
        for norm in ("norm_q", "norm_k"):
            rules.append(Rule(f"blocks.{{i}}.{attn}.{norm}.weight", f"blocks.{attn}.{norm}.scale"))
    return rules


def load(path: str | os.PathLike, config: WanConfig, *, mesh=None, strategy=None):
    """Builds a `WanTransformer` from a diffusers checkpoint (file, index or directory)."""

    return load_converted(
        WanTransformer, key_map, path, config, mesh=mesh, strategy=strategy, ignore=IGNORED
    )
