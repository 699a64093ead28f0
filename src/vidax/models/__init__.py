"""Model families (DiTs, VAEs, text encoders) and the preset registry.

spec = vidax.models.get("wan2.1-1.3b")
model = spec.loader(checkpoint_dir, spec.config)
"""

from vidax.models.registry import ModelSpec, SamplingDefaults, VAESpec, get, get_vae, names

__all__ = ["ModelSpec", "SamplingDefaults", "VAESpec", "get", "get_vae", "names"]
