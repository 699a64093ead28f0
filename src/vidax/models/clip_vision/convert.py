"""Key map: transformers `CLIPVisionModel` safetensors <-> vidax `CLIPVisionEncoder`."""

from __future__ import annotations

import os

from vidax.checkpoint import Rule, linear_rules, open_checkpoint
from vidax.models.clip_vision.config import CLIPVisionConfig
from vidax.models.clip_vision.model import CLIPVisionEncoder
from vidax.models.dit_config import load_converted

# Checkpoints written by transformers 4.x (Wan's `image_encoder/`, any `CLIPModel`) nest the
# encoder under "vision_model."; transformers 5 saves a `CLIPVisionModel` without the prefix.
PREFIXES = ("vision_model.", "")

# Present in some checkpoints but not part of the encoder: the projection of
# `CLIPVisionModelWithProjection` / `CLIPModel`, a full `CLIPModel`'s text half, and the
# position-id buffer that transformers before 4.31 saved.
IGNORED = (
    "visual_projection.weight",
    "text_model.*",
    "text_projection.weight",
    "logit_scale",
    "*embeddings.position_ids",
)


def key_map(config: CLIPVisionConfig, *, prefix: str = PREFIXES[0]) -> list[Rule]:
    """Declarative map from transformers keys to vidax parameter paths (see `vidax.checkpoint`).

    Args:
      config: the encoder's configuration (patch geometry for the patch embedding).
      prefix: one of `PREFIXES`, the checkpoint's key prefix.
    """
    if prefix not in PREFIXES:
        raise ValueError(f"prefix must be one of {PREFIXES}, got {prefix!r}")
    p, c, d = config.patch_size, config.num_channels, config.hidden_size

    def patch_in(w):  # Conv2d (d, c, p, p) -> Linear (p*p*c, d), rows in (ph, pw, c) order
        return w.transpose(2, 3, 1, 0).reshape(p * p * c, d)

    def patch_in_inverse(k):
        return k.reshape(p, p, c, d).transpose(3, 2, 0, 1)

    layer = f"{prefix}encoder.layers.{{i}}"
    rules = [
        Rule(
            f"{prefix}embeddings.patch_embedding.weight",
            "patch_embedding.kernel",
            patch_in,
            patch_in_inverse,
        ),
        Rule(f"{prefix}embeddings.class_embedding", "class_embedding"),
        # nn.Embedding(tokens, d).weight is already (tokens, d).
        Rule(f"{prefix}embeddings.position_embedding.weight", "position_embedding"),
    ]
    norms = [
        (f"{prefix}pre_layrnorm", "pre_norm"),  # sic: transformers' name
        (f"{prefix}post_layernorm", "post_norm"),
        (f"{layer}.layer_norm1", "blocks.attention_norm"),
        (f"{layer}.layer_norm2", "blocks.mlp_norm"),
    ]
    for source, target in norms:
        rules += [
            Rule(f"{source}.weight", f"{target}.scale"),
            Rule(f"{source}.bias", f"{target}.bias"),
        ]
    for proj in ("q", "k", "v", "out"):
        rules += linear_rules(f"{layer}.self_attn.{proj}_proj", f"blocks.attention.{proj}")
    rules += linear_rules(f"{layer}.mlp.fc1", "blocks.mlp.proj_in")
    rules += linear_rules(f"{layer}.mlp.fc2", "blocks.mlp.proj_out")
    return rules


def load(
    path: str | os.PathLike, config: CLIPVisionConfig, *, mesh=None, strategy=None
) -> CLIPVisionEncoder:
    """Builds a `CLIPVisionEncoder` from a transformers checkpoint (file, index or directory).

    Accepts `CLIPVisionModel` and `CLIPVisionModelWithProjection` exports (Wan's
    `image_encoder/`) and full `CLIPModel` checkpoints; the keys in `IGNORED` are skipped.

    Raises:
      CheckpointError: the checkpoint is missing, corrupt or does not match `config`, naming
        the offending keys.
    """
    # Only the header is read here; tensors are streamed by the loader.
    keys = open_checkpoint(path)
    prefix = PREFIXES[0] if any(k.startswith(PREFIXES[0]) for k in keys) else PREFIXES[1]
    return load_converted(
        CLIPVisionEncoder,
        lambda config: key_map(config, prefix=prefix),
        path,
        config,
        mesh=mesh,
        strategy=strategy,
        ignore=IGNORED,
    )
