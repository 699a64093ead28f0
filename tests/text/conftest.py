"""Fixtures for the UMT5 prompt-encoding tests: a tiny encoder and a word-level tokenizer."""

import pytest
from flax import nnx
from tests.text._tokenizers import word_tokenizer

from vidax.models.umt5 import PRESETS, UMT5Encoder


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="session")
def encoder():
    return UMT5Encoder(PRESETS["tiny"], rngs=nnx.Rngs(0))
