"""CLIP vision-encoder configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vidax.models import vit


@dataclasses.dataclass(frozen=True, kw_only=True)
class CLIPVisionConfig(vit.ViTConfig):
    """Architecture and numerics of a CLIP ViT image encoder (transformers' `CLIPVisionModel`);
    fields as `vidax.models.vit.ViTConfig`, with transformers' CLIP defaults: layer_norm_eps
    1e-5 and hidden_act "quick_gelu" (OpenAI's CLIP; OpenCLIP's LAION models such as ViT-H/14
    use "gelu")."""

    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    @property
    def num_tokens(self) -> int:
        """Tokens of one image: the class token, then grid * grid patches."""
        return 1 + self.num_patches

    @property
    def num_params(self) -> int:
        """Parameter count, e.g. to size host memory before loading."""
        d = self.hidden_size
        embeddings = self.patch_features * d + d + self.num_tokens * d
        return embeddings + self.num_hidden_layers * self.layer_params + 2 * 2 * d


PRESETS: dict[str, CLIPVisionConfig] = {
    # OpenCLIP ViT-H/14 (laion/CLIP-ViT-H-14-laion2B-s32B-b79K): the `image_encoder/` of Wan 2.1
    # image-to-video, whose 1280-wide penultimate hidden states are the DiT's image tokens.
    "clip-vit-h-14": CLIPVisionConfig(
        hidden_size=1280,
        intermediate_size=5120,
        num_hidden_layers=32,
        num_attention_heads=16,
        image_size=224,
        patch_size=14,
        hidden_act="gelu",
    ),
    "tiny": CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    ),
}


def from_hf_config(config: Mapping[str, Any], **overrides) -> CLIPVisionConfig:
    """A `CLIPVisionConfig` from a transformers `config.json` (as a dict).

    Accepts a `CLIPVisionConfig` (`model_type` "clip_vision_model", e.g. Wan's
    `image_encoder/config.json`) or a full `CLIPConfig`, whose `vision_config` is read.
    Parameters are stored in the checkpoint's own dtype when it is one we support, else
    float32. `overrides` win.

    Raises:
      ValueError: a size is missing, or a key is unknown or set to something this port does
        not implement (e.g. pruned heads): nothing the config says is dropped silently.
    """
    fields = vit.hf_config_fields(
        config,
        name="CLIP vision",
        model_type="clip_vision_model",
        # The projection belongs to `CLIPVisionModelWithProjection`, not the encoder.
        no_effect=frozenset({"projection_dim"}),
    )
    return CLIPVisionConfig(**{**fields, **overrides})
