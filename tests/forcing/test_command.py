"""Streaming generation: the file grows chunk by chunk; bad sizes and budgets fail clearly."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from tests.forcing.conftest import SMALL

from vidax.forcing import ForcingConfig, StreamDecoder
from vidax.forcing.command import stream_generate
from vidax.models.registry import CausalPreset, is_causal
from vidax.models.registry import get_causal as get
from vidax.models.wan_vae import PRESETS as VAE_PRESETS
from vidax.models.wan_vae import WanVAE
from vidax.video import read_video

DENSE = ForcingConfig(
    chunk_frames=1, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=1, window_frames=2,
    block_size=4,
)  # fmt: skip
PRESET = CausalPreset(
    name="test-causal",
    base="tiny-v1",
    dense=DENSE,
    sparse=dataclasses.replace(
        DENSE, attention="sparse", local_topk=1, memory_blocks=1, memory_topk=1
    ),
)


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    """A random VAE with 4x spatial / 4x temporal strides and the small model's channels."""
    config = dataclasses.replace(
        VAE_PRESETS["tiny"],
        z_dim=SMALL.in_channels,
        dim_mult=(1, 2, 2),
        temperal_downsample=(True, True),
        latents_mean=None,
        latents_std=None,
    )
    return WanVAE(config, rngs=nnx.Rngs(0))


def test_stream_writes_chunk_by_chunk(small_model, vae, tmp_path):
    seen = []
    out = tmp_path / "stream.mp4"
    result = stream_generate(
        PRESET, "a red circle moving right", out, frames=9, height=16, width=16, seed=3,
        attention="sparse", transformer=small_model, vae=vae,
        on_chunk=lambda done, total, written: seen.append((done, total, written)),
    )  # fmt: skip
    # 9 frames = 3 latent frames = 3 one-frame chunks: frame 0 decodes to 1 pixel frame, the
    # others to 4 each; every chunk was written before the next one was generated.
    assert seen == [(1, 3, 1), (2, 3, 5), (3, 3, 9)]
    assert result.frames == 9 and result.chunks == 3 and len(result.chunk_seconds) == 3
    assert read_video(out).shape == (9, 16, 16, 3)
    assert result.latents.shape == (3, 4, 4, SMALL.in_channels)
    assert np.isfinite(result.latents).all()


@pytest.mark.slow
def test_stream_decoder_equals_whole_decode(vae):
    z = jax.random.normal(jax.random.key(0), (1, 4, 4, 4, SMALL.in_channels))
    decoder = StreamDecoder(vae)
    parts = [decoder(z[:, :1]), decoder(z[:, 1:3]), decoder(z[:, 3:])]
    assert [p.shape[1] for p in parts] == [1, 8, 4]
    whole = (np.asarray(vae.decode(z)) + 1.0) / 2.0
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(frames=17), "chunks of 3 do not divide"),  # 5 latent frames
        (dict(frames=20), "4k\\+1"),
        (dict(frames=21, forcing_overrides={"local_topk": 13}), "larger than the local window"),
        (dict(frames=21, forcing_overrides={"memory_blocks": 13}), "larger than the window"),
        (dict(frames=21, attention="flash"), "dense' or 'sparse"),
        (dict(model="tiny-acausal"), "unknown causal model"),
    ],
)
def test_bad_settings_fail_before_generating(kwargs, match, tmp_path, vae):
    args = dict(model="tiny-causal", prompt="a circle", out=tmp_path / "x.mp4", vae=vae)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stream_generate(**args)
    assert not (tmp_path / "x.mp4").exists()


def test_causal_presets():
    assert is_causal("tiny-causal") and not is_causal("tiny")
    preset = get("tiny-causal")
    dense = preset.dense.layout((8, 8))
    sparse = preset.sparse.layout((8, 8))
    # The shipped sparse budget keeps the peak KV cache within the 0.58x of dense.
    assert sparse.peak_tokens() / dense.peak_tokens() <= 0.58


def test_tiny_causal_is_distilled_from_tiny_and_its_sparse_model_is_training_free():
    # tiny-causal uses the base `tiny` model's VAE and text encoder; without trained sparse
    # weights its sparse model is the dense file, whose sparse heads are still zero.
    from safetensors.numpy import load_file

    from vidax.models.registry import ASSETS
    from vidax.models.registry import get as get_model

    preset = get("tiny-causal")
    base = get_model("tiny")
    assert preset.base == "tiny" and preset.spec.config == base.config
    assert (preset.spec.vae, preset.spec.weights) == (base.vae, base.weights)
    if preset.text_encoder:  # pinned: shipped beside the causal weights
        assert (ASSETS / "tiny-causal" / "text_encoder.safetensors").is_file()
    dense = preset.weights_path("dense")
    assert dense == ASSETS / "tiny-causal" / "dense.safetensors"
    if not (ASSETS / "tiny-causal" / "sparse.safetensors").exists():
        assert preset.weights_path("sparse") == dense
        heads = {k: v for k, v in load_file(dense).items() if k.startswith("sparse_attention.")}
        assert heads and all(not np.any(v.astype(np.float32)) for v in heads.values())
    with pytest.raises(ValueError, match="'dense' or 'sparse'"):
        preset.weights_path("flash")
    with pytest.raises(ValueError, match="no asset folder"):
        CausalPreset(name="x", base="tiny", dense=DENSE, sparse=DENSE, vae="shapes")


def test_a_causal_preset_can_pin_the_text_encoder_it_was_trained_with(tmp_path, monkeypatch):
    import shutil

    from vidax.models import weights
    from vidax.models.registry import ASSETS

    pinned = CausalPreset(
        name="x", base="tiny", dense=DENSE, sparse=DENSE, weights="pin", text_encoder=True
    )
    assert pinned.spec.text_encoder_weights == "pin" and pinned.spec.weights == "tiny"
    monkeypatch.setattr(weights, "ASSETS", tmp_path)
    assert weights.missing_weights(pinned.spec, transformer=False, vae=False) == [
        weights.TEXT_ENCODER
    ]
    (tmp_path / "pin").mkdir()
    shutil.copy(ASSETS / "tiny" / "text_encoder.safetensors", tmp_path / "pin")
    assert weights.missing_weights(pinned.spec, transformer=False, vae=False) == []
    assert weights._text_encoder_path(pinned.spec, None) == tmp_path / "pin" / (
        "text_encoder.safetensors"
    )
    with pytest.raises(ValueError, match="pins a VAE or text encoder but has no asset folder"):
        CausalPreset(name="x", base="tiny", dense=DENSE, sparse=DENSE, text_encoder=True)


# The text encoder tiny-causal v7 was trained with (`tiny` run7's; TRAINING.md).
TINY_CAUSAL_ENCODER_SHA256 = "2383fb7280bc634553c1f0a529d1f17c8fecd2a6ba410a9976050574ddcd17d4"


def test_tiny_causal_reads_the_text_encoder_it_was_trained_with():
    """Unpinned, tiny-causal reads `tiny`'s encoder: retraining `tiny` must not silently change
    what the causal weights are conditioned on (pin the old file: `text_encoder=True`)."""
    import hashlib

    from vidax.models.registry import ASSETS

    preset = get("tiny-causal")
    folder = ASSETS / ("tiny-causal" if preset.text_encoder else "tiny")
    digest = hashlib.sha256((folder / "text_encoder.safetensors").read_bytes()).hexdigest()
    assert digest == TINY_CAUSAL_ENCODER_SHA256, (
        f"{folder / 'text_encoder.safetensors'} is not the encoder tiny-causal was trained with: "
        "pin that one beside the causal weights (CausalPreset.text_encoder=True)"
    )
