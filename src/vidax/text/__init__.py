"""Text conditioning: prompts -> `PromptEmbeds` for a preset (`embed_prompts`, or precomputed with
`load_prompt_embeds`), UMT5 prompt embeddings as Wan uses them, a disk cache, a hashed embedder."""

from vidax.text.cache import PromptCache, encoder_fingerprint
from vidax.text.encode import clean_prompt, encode_prompts, encode_prompts_with_lengths
from vidax.text.hashed import HashedTextEmbedder
from vidax.text.prompts import (
    PromptEmbedder,
    PromptEmbeds,
    embed_prompts,
    fit_prompt_embeds,
    load_prompt_embeds,
)

__all__ = [
    "HashedTextEmbedder",
    "PromptCache",
    "PromptEmbedder",
    "PromptEmbeds",
    "clean_prompt",
    "embed_prompts",
    "encode_prompts",
    "encode_prompts_with_lengths",
    "encoder_fingerprint",
    "fit_prompt_embeds",
    "load_prompt_embeds",
]
