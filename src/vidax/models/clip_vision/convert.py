"""Key map: transformers `CLIPVisionModel` safetensors <-> vidax `CLIPVisionEncoder`."""

from __future__ import annotations

import os

from vidax.checkpoint import Rule
from vidax.models import vit
from vidax.models.clip_vision.config import CLIPVisionConfig
from vidax.models.clip_vision.model import CLIPVisionEncoder

# Checkpoints written by transformers 4.x (Wan's `image_encoder/`, any `CLIPModel`) nest the
# encoder under "vision_model."; transformers 5 saves a `CLIPVisionModel` without the prefix.
PREFIXES = vit.PREFIXES

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
    return [
        vit.patch_rule(
            f"{prefix}embeddings.patch_embedding.weight", "patch_embedding.kernel", config
        ),
        Rule(f"{prefix}embeddings.class_embedding", "class_embedding"),
        # nn.Embedding(tokens, d).weight is already (tokens, d).
        Rule(f"{prefix}embeddings.position_embedding.weight", "position_embedding"),
        *vit.norm_rules(f"{prefix}pre_layrnorm", "pre_norm"),  # sic: transformers' name
        *vit.norm_rules(f"{prefix}post_layernorm", "post_norm"),
        *vit.layer_rules(prefix),
    ]


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
    return vit.load(
        CLIPVisionEncoder, key_map, path, config, ignore=IGNORED, mesh=mesh, strategy=strategy
    )
