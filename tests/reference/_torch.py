"""Shared helpers for parity tests against torch reference implementations."""

import numpy as np


def assert_close(got, want, rel: float, what: str = "") -> None:
    """max |got - want| <= rel * max |want| (tolerance relative to the output scale)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(np.abs(want).max(), 1e-12)
    err = np.abs(got - want).max()
    assert err <= rel * scale, f"{what}: max abs err {err:.3g} > {rel} x scale {scale:.3g}"


def to_numpy(t):
    return t.detach().float().cpu().numpy()


def train_sentencepiece(path):
    """A tiny T5-style sentencepiece model (pad 0, eos 1, unk 2) trained offline into
    `path/spiece.model`; returns `path`."""
    import io

    import sentencepiece as spm

    sentences = [
        "a red cube rolls over a blue sphere",
        "the green cone spins slowly",
        "two yellow cubes bounce on the floor",
        "a cat walks on the grass in the sunlight",
        "camera pans left over snowy mountains",
    ] * 10
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=40,
        hard_vocab_limit=False,
        pad_id=0,  # T5's special ids
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    (path / "spiece.model").write_bytes(model.getvalue())
    return path
