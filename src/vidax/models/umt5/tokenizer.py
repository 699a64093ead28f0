"""Prompt -> padded UMT5 token ids, from a user-supplied `tokenizer.json` or `spiece.model`.

A thin wrapper over the `tokenizers` or `sentencepiece` package (the optional extra
`vidax[text]`, imported only when a tokenizer is opened). It reproduces what Wan's pipeline asks
of the Hugging Face T5 tokenizer (`padding="max_length", truncation=True,
add_special_tokens=True`): the text's pieces, truncated so that EOS always fits, then EOS, then
padding.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from vidax.errors import require_extra

_FILES = ("tokenizer.json", "spiece.model")


class Tokenizer:
    """UMT5 tokenizer over `tokenizers` (tokenizer.json) or `sentencepiece` (spiece.model).

    Args:
      path: a `tokenizer.json`, a `*.model` sentencepiece file, or a directory holding one
        (`tokenizer.json` preferred, as in a Hugging Face `tokenizer/` folder).
      eos_token / pad_token: special tokens looked up in the vocabulary. A vocabulary without
        the pad token pads with id 0, which the mask hides anyway.

    Raises:
      FileNotFoundError: no tokenizer file at `path`.
      ImportError: the backend package is not installed.
      ValueError: the file cannot be parsed or lacks the EOS token.
    """

    def __init__(
        self, path: str | os.PathLike, *, eos_token: str = "</s>", pad_token: str = "<pad>"
    ):
        self.path = _resolve(Path(path))
        self._backend: _TokenizersBackend | _SentencePieceBackend
        if self.path.suffix == ".json":
            self._backend = _TokenizersBackend(self.path)
        else:
            self._backend = _SentencePieceBackend(self.path)
        eos = self._backend.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"{self.path}: EOS token {eos_token!r} is not in the vocabulary")
        pad = self._backend.token_to_id(pad_token)
        self.eos_id: int = eos
        self.pad_id: int = 0 if pad is None else pad

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @functools.cached_property
    def identity(self) -> str:
        """A hash of the tokenizer file and special ids, for cache keys."""
        digest = hashlib.sha256(self.path.read_bytes())
        digest.update(f"eos={self.eos_id},pad={self.pad_id}".encode())
        return digest.hexdigest()

    def tokenize(self, prompts: str | list[str]) -> list[list[int]]:
        """The text pieces' ids of each prompt, without special tokens."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be a string or a list of strings")
        return self._backend.encode(prompts)

    def encode(
        self, prompts: str | list[str], max_length: int = 512
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokenises, appends EOS, truncates and pads to `max_length`.

        Args:
          prompts: one prompt or a list of b prompts.
          max_length: tokens per row, EOS included; longer prompts keep their first
            `max_length - 1` pieces.

        Returns:
          ids (b, max_length) int32 and mask (b, max_length) bool (True on real tokens, EOS
          included).
        """
        if max_length < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")
        pieces = self.tokenize(prompts)
        ids = np.full((len(pieces), max_length), self.pad_id, np.int32)
        mask = np.zeros((len(pieces), max_length), bool)
        for row, tokens in enumerate(pieces):
            tokens = [*tokens[: max_length - 1], self.eos_id]
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = True
        return ids, mask


def _resolve(path: Path) -> Path:
    expected = f"expected a {' or '.join(_FILES)} file, or a directory holding one"
    if path.is_dir():
        for name in _FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"no tokenizer in directory {path}: {expected}")
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {path} ({expected})")
    if path.suffix not in (".json", ".model"):
        raise ValueError(f"unrecognised tokenizer file {path}: {expected}")
    return path


class _TokenizersBackend:
    def __init__(self, path: Path):
        tokenizers = require_extra("tokenizers", extra="text", purpose=f"reading {path}")
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception for malformed files
            raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None
        # Truncation and padding are ours to do (so EOS always survives truncation).
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, texts: list[str]) -> list[list[int]]:
        # Special tokens come from us: tokenizer.json post-processors differ in whether they add EOS.
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]


class _SentencePieceBackend:
    def __init__(self, path: Path):
        sentencepiece = require_extra("sentencepiece", extra="text", purpose=f"reading {path}")
        self._processor = sentencepiece.SentencePieceProcessor()
        try:
            self._processor.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise ValueError(f"{path}: not a valid sentencepiece model ({e})") from None

    @property
    def vocab_size(self) -> int:
        return self._processor.GetPieceSize()

    def token_to_id(self, token: str) -> int | None:
        i = self._processor.PieceToId(token)
        # Unknown pieces map to the unk id rather than failing.
        return (
            None if i == self._processor.unk_id() and token != self._processor.IdToPiece(i) else i
        )

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._processor.Encode(texts)]
