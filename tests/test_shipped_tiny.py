"""The shipped `tiny` weights (vidax/assets/tiny) still do what their TRAINING.md says.

Quality floors, not exact values: they fail when the weights regress (e.g. a VAE that drifts
over long clips, or a DiT that no longer follows captions), and leave room for float noise.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from vidax import pipeline
from vidax.data import EVAL_PROMPTS, render
from vidax.metrics import caption_adherence, psnr
from vidax.models import get


@pytest.fixture(scope="module")
def shipped():
    spec = get("tiny")
    return spec, spec.load(), spec.load_vae()


def test_vae_round_trip_keeps_the_objects_over_a_whole_clip(shipped):
    # A VAE trained on 9-frame clips only reconstructed frames 24-32 of a 33-frame clip at
    # ~14 dB (vs ~28 dB for frames 0-8); the shipped one saw 33-frame clips too.
    _, _, vae = shipped
    early, late, adherence = [], [], []
    for prompt in EVAL_PROMPTS[::5]:
        frames, _ = render(prompt.spec, 33)
        rec = np.asarray(vae.decode(vae.encode(jnp.asarray(frames)[None]))[0])
        drift = psnr(rec, frames, per_frame=True)
        early.append(drift[:9].mean())
        late.append(drift[24:].mean())
        adherence.append(caption_adherence(rec, prompt.caption))
    assert np.mean(early) > 25.0
    assert np.mean(late) > np.mean(early) - 2.0, (early, late)
    assert np.mean(adherence) >= 0.8, adherence


def test_generated_videos_follow_their_captions(shipped):
    spec, transformer, vae = shipped
    prompts = [p for p in EVAL_PROMPTS if p.category in ("static", "slow")]
    scores = []
    for prompt in prompts:
        video = pipeline.generate(
            spec, prompt=prompt.caption, seed=prompt.seed, transformer=transformer, vae=vae
        )
        scores.append(caption_adherence(video.frames * 2.0 - 1.0, prompt.caption))
    # Measured: 0.92 for these weights, 0.62 for the base DiT they were fine-tuned from, 0.17
    # for the first shipped ones (same metric).
    assert np.mean(scores) >= 0.7, scores


def test_shipped_tiny_causal_keeps_its_subjects_chunk_after_chunk(tmp_path):
    # The first tiny-causal turned into green texture within ~20 frames; the v2 model holds
    # its scene (the 129-frame evaluation is in vidax/assets/tiny-causal/TRAINING.md).
    from vidax.forcing.command import stream_generate
    from vidax.metrics import subject_consistency
    from vidax.video import read_video

    prompts = [p for p in EVAL_PROMPTS if p.category in ("static", "slow")][::2]
    adherence, consistency = [], []
    for prompt in prompts:
        result = stream_generate(
            "tiny-causal",
            prompt.caption,
            tmp_path / "x.mp4",
            frames=45,  # 4 chunks: the cache past its sink
            seed=prompt.seed,
            attention="dense",
        )
        frames = read_video(result.path).astype(np.float32) / 127.5 - 1.0
        adherence.append(caption_adherence(frames[-12:], prompt.caption))
        consistency.append(subject_consistency(frames))
    # Measured: adherence 1.0 for all six, subject consistency 0.90-0.99.
    assert np.mean(adherence) >= 0.8, adherence
    assert np.mean(consistency) >= 0.8, consistency
