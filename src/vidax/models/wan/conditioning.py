"""What the shared sampler (`vidax.pipeline`) needs to know about Wan: its forward's conditioning."""

from __future__ import annotations

from vidax.models.wan.config import WanConfig


def conditioning(config: WanConfig, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s)): Wan attends to zero-padded text without a mask."""
    del config, guidance
    return {"context": text.embeds * text.mask[..., None].astype(text.embeds.dtype)}
