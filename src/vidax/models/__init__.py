"""Model families (DiTs, VAEs, text encoders) and the preset registry.

spec = vidax.models.get("wan2.1-1.3b")
model = spec.load(checkpoint_dir)
"""

from vidax.models.registry import (
    CausalPreset,
    ImageEncoderSpec,
    ModelSpec,
    SamplingDefaults,
    VAESpec,
    get,
    get_causal,
    get_image_encoder,
    get_vae,
    is_causal,
    names,
)

__all__ = [
    "CausalPreset",
    "ImageEncoderSpec",
    "ModelSpec",
    "SamplingDefaults",
    "VAESpec",
    "get",
    "get_causal",
    "get_image_encoder",
    "get_vae",
    "is_causal",
    "names",
]
