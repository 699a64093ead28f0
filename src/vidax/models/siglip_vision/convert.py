"""Key map: transformers `SiglipVisionModel` safetensors <-> vidax `SiglipVisionEncoder`."""

from __future__ import annotations

import os

from vidax.checkpoint import Rule
from vidax.models import vit
from vidax.models.siglip_vision.config import SiglipVisionConfig
from vidax.models.siglip_vision.model import SiglipVisionEncoder

PREFIXES = vit.PREFIXES

# Present in some checkpoints but not part of the ported encoder: the attention-pooling head
# (`pooler_output` only), a full `SiglipModel`'s text half and logit scale / bias, and the
# position-id buffer older transformers saved.
IGNORED = (
    "head.*",
    "vision_model.head.*",
    "text_model.*",
    "logit_scale",
    "logit_bias",
    "*embeddings.position_ids",
)


def key_map(config: SiglipVisionConfig, *, prefix: str = PREFIXES[0]) -> list[Rule]:
    """Declarative map from transformers keys to vidax parameter paths (see `vidax.checkpoint`).

    Args:
      config: the encoder's configuration (patch geometry for the patch embedding).
      prefix: one of `PREFIXES`, the checkpoint's key prefix.
    """
    patch = f"{prefix}embeddings.patch_embedding"
    return [
        vit.patch_rule(f"{patch}.weight", "patch_embedding.kernel", config),
        Rule(f"{patch}.bias", "patch_embedding.bias"),
        # nn.Embedding(tokens, d).weight is already (tokens, d).
        Rule(f"{prefix}embeddings.position_embedding.weight", "position_embedding"),
        *vit.norm_rules(f"{prefix}post_layernorm", "post_norm"),
        *vit.layer_rules(prefix),
    ]


def load(
    path: str | os.PathLike, config: SiglipVisionConfig, *, mesh=None, strategy=None
) -> SiglipVisionEncoder:
    """Builds a `SiglipVisionEncoder` from a transformers checkpoint (file, index or directory).

    Accepts `SiglipVisionModel` exports (HunyuanVideo-1.5 I2V's `image_encoder/`, with or
    without the pooling head) and full `SiglipModel` checkpoints; the keys in `IGNORED` are
    skipped.

    Raises:
      CheckpointError: the checkpoint is missing, corrupt or does not match `config`, naming
        the offending keys.
    """
    return vit.load(
        SiglipVisionEncoder, key_map, path, config, ignore=IGNORED, mesh=mesh, strategy=strategy
    )
