"""SigLIP vision-encoder configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vidax.models import vit


@dataclasses.dataclass(frozen=True, kw_only=True)
class SiglipVisionConfig(vit.ViTConfig):
    """Architecture and numerics of a SigLIP image encoder (transformers' `SiglipVisionModel`);
    fields as `vidax.models.vit.ViTConfig`, with transformers' SigLIP defaults: layer_norm_eps
    1e-6 and hidden_act "gelu_pytorch_tanh"."""

    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def num_tokens(self) -> int:
        """Tokens of one image: grid * grid patches (no class token)."""
        return self.num_patches

    @property
    def num_params(self) -> int:
        """Parameter count (without the attention-pooling head, which is not ported)."""
        d = self.hidden_size
        embeddings = self.patch_features * d + d + self.num_tokens * d
        return embeddings + self.num_hidden_layers * self.layer_params + 2 * d


PRESETS: dict[str, SiglipVisionConfig] = {
    # google/siglip-so400m-patch14-384 (via FLUX.1 Redux): HunyuanVideo-1.5 image-to-video's
    # `image_encoder/`. 384 // 14 = 27 patches a side: 729 tokens of width 1152 (the last 6 pixel
    # rows and columns are not read, as the stride-14 convolution does).
    "siglip-so400m-patch14-384": SiglipVisionConfig(
        hidden_size=1152,
        intermediate_size=4304,
        num_hidden_layers=27,
        num_attention_heads=16,
        image_size=384,
        patch_size=14,
    ),
    # 32 wide: the width of the tiny HunyuanVideo-1.5's image embedder (`image_dim`).
    "siglip-tiny": SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    ),
}


def from_hf_config(config: Mapping[str, Any], **overrides) -> SiglipVisionConfig:
    """A `SiglipVisionConfig` from a transformers `config.json` (as a dict).

    Accepts a `SiglipVisionConfig` (`model_type` "siglip_vision_model", e.g. HunyuanVideo-1.5
    I2V's `image_encoder/config.json`) or a full `SiglipConfig`, whose `vision_config` is read.
    Parameters are stored in the checkpoint's own dtype when it is one we support, else
    float32. `overrides` win.

    Raises:
      ValueError: a size is missing, or a key is unknown or set to something this port does
        not implement: nothing the config says is dropped silently.
    """
    fields = vit.hf_config_fields(
        config,
        name="SigLIP vision",
        model_type="siglip_vision_model",
        # The attention-pooling head gives `pooler_output` only, which this port leaves out.
        no_effect=frozenset({"vision_use_head"}),
    )
    return SiglipVisionConfig(**{**fields, **overrides})
