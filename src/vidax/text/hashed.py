"""A deterministic, download-free text embedder for small models trained inside vidax.

Each lower-cased word maps to a fixed Gaussian vector derived from a hash of the word, plus a
sinusoidal position code so that word order (which colour goes with which shape) is visible to
cross-attention. It has no parameters: models trained on it learn to read it, and it is identical
on every machine and version of numpy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np

_WORD = re.compile(r"[a-z0-9]+")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HashedTextEmbedder:
    """prompt -> (text_len, dim) float32 embeddings and a (text_len,) validity mask.

    Attributes:
      dim: embedding width (the DiT's `text_dim`).
      text_len: tokens per prompt; longer prompts are truncated, shorter ones zero-padded.
      position_scale: weight of the sinusoidal position code relative to the word vector.
    """

    dim: int
    text_len: int
    position_scale: float = 0.5

    def __post_init__(self):
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"HashedTextEmbedder.dim must be even and >= 2, got {self.dim}")
        if self.text_len < 1:
            raise ValueError(f"HashedTextEmbedder.text_len must be positive, got {self.text_len}")

    @staticmethod
    def words(prompt: str) -> list[str]:
        return _WORD.findall(prompt.lower())

    def _word_vector(self, word: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        # PCG64 + standard_normal is stable across numpy versions for a given seed.
        return np.random.Generator(np.random.PCG64(seed)).standard_normal(self.dim)

    def _position_code(self, n: int) -> np.ndarray:
        pos = np.arange(n, dtype=np.float64)[:, None]
        freqs = 1.0 / (100.0 ** (np.arange(0, self.dim, 2, dtype=np.float64) / self.dim))
        code = np.zeros((n, self.dim))
        code[:, 0::2] = np.sin(pos * freqs)
        code[:, 1::2] = np.cos(pos * freqs)
        return code

    def __call__(self, prompts: str | list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Embeds one prompt or a list.

        Returns:
          embeddings (b, text_len, dim) float32 (zero past each prompt's end) and
          mask (b, text_len) bool (True on real tokens).
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        out = np.zeros((len(prompts), self.text_len, self.dim), np.float32)
        mask = np.zeros((len(prompts), self.text_len), bool)
        code = self._position_code(self.text_len)
        for b, prompt in enumerate(prompts):
            words = self.words(prompt)[: self.text_len]
            for i, word in enumerate(words):
                out[b, i] = self._word_vector(word) + self.position_scale * code[i]
            mask[b, : len(words)] = True
        return out, mask
