"""Prompts -> UMT5 embeddings exactly as Wan 2.1 consumes them.

Wan conditions on umT5-XXL's `last_hidden_state`, trimmed to each prompt's true length (EOS
included) and zero-padded to `max_length` (512) tokens; the DiT's cross-attention has no mask,
so the zeros are what it sees past the prompt.
"""

from __future__ import annotations

import functools
import html
import re

import jax
import numpy as np
from flax import nnx

# Running the encoder on fewer tokens than `max_length` gives the same embeddings for the real
# tokens: padded keys are masked out and the relative position bias only depends on distances.
# Typical prompts are ~100 tokens, so encoding at the next power of two (a handful of compiled
# shapes) instead of always 512 saves most of the encoder's work.
_MIN_BUCKET = 16


def clean_prompt(text: str) -> str:
    """diffusers' Wan prompt cleaning: ftfy (if installed), double HTML unescape, whitespace."""
    try:
        import ftfy
    except ImportError:
        pass
    else:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def encode_prompts(
    encoder,
    tokenizer,
    prompts: str | list[str],
    max_length: int = 512,
    *,
    clean: bool = True,
) -> np.ndarray:
    """Embeds prompts with a UMT5 encoder the way Wan's pipeline does.

    Args:
      encoder: a `vidax.models.umt5.UMT5Encoder`.
      tokenizer: a `vidax.models.umt5.Tokenizer` (or anything with the same `encode`).
      prompts: one prompt or a list of b prompts.
      max_length: text tokens per prompt (Wan: 512); longer prompts are truncated.
      clean: apply `clean_prompt` first, as diffusers does.

    Returns:
      (b, max_length, d) float32 embeddings, zero past each prompt's true length.
    """
    embeddings, _ = encode_prompts_with_lengths(
        encoder, tokenizer, prompts, max_length, clean=clean
    )
    return embeddings


def encode_prompts_with_lengths(
    encoder, tokenizer, prompts: str | list[str], max_length: int = 512, *, clean: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """`encode_prompts`, also returning the (b,) int true lengths (EOS included)."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if clean:
        prompts = [clean_prompt(p) for p in prompts]
    ids, mask = tokenizer.encode(prompts, max_length=max_length)
    vocab = encoder.config.vocab_size
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(
            f"token ids span [{ids.min()}, {ids.max()}] but the encoder has {vocab} embeddings; "
            "the tokenizer does not belong to this encoder"
        )
    lengths = mask.sum(axis=1)
    d = encoder.config.d_model
    out = np.zeros((len(prompts), max_length, d), np.float32)
    if not prompts:
        return out, lengths
    width = min(max_length, max(_MIN_BUCKET, 1 << int(lengths.max() - 1).bit_length()))
    graphdef, state = nnx.split(encoder)
    hidden = np.asarray(jax.device_get(_forward(graphdef, state, ids[:, :width], mask[:, :width])))
    keep = np.arange(width)[None, :] < lengths[:, None]
    out[:, :width] = np.where(keep[..., None], hidden, np.float32(0))
    return out, lengths


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state)(ids, mask)
