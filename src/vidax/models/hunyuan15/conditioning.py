"""What the shared sampler (`vidax.pipeline`) needs to know about HunyuanVideo-1.5: its forward's
conditioning. (Its condition channels beside the latent are zeros for text-to-video:
`vidax.models.dit_stages.with_condition`, as diffusers' `prepare_cond_latents_and_mask`.)"""

from __future__ import annotations

from vidax.models.hunyuan15.config import HunyuanVideo15Config


def conditioning(config: HunyuanVideo15Config, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s))."""
    del config, guidance
    return {"text": text.embeds, "text_mask": text.mask}
