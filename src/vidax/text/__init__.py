"""Text conditioning: UMT5 prompt embeddings as Wan uses them, a disk cache, a hashed embedder."""

from vidax.text.cache import PromptCache, encoder_fingerprint
from vidax.text.encode import clean_prompt, encode_prompts, encode_prompts_with_lengths
from vidax.text.hashed import HashedTextEmbedder

__all__ = [
    "HashedTextEmbedder",
    "PromptCache",
    "clean_prompt",
    "encode_prompts",
    "encode_prompts_with_lengths",
    "encoder_fingerprint",
]
