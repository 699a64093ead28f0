import numpy as np
import pytest

from vidax.data import EVAL_PROMPTS, render
from vidax.metrics import flicker_score, temporal_flicker

PROMPTS = {p.name: p for p in EVAL_PROMPTS}


@pytest.fixture(scope="module")
def moving():
    return render(PROMPTS["multi-2"].spec, 33)[0]


def test_frozen_video_has_no_flicker(moving):
    frozen = np.repeat(moving[:1], 33, axis=0)
    assert temporal_flicker(frozen) == 0.0
    assert flicker_score(frozen) == 1.0


def test_ground_truth_flickers_little_and_shuffling_flickers_a_lot(moving):
    shuffled = moving[np.random.default_rng(0).permutation(33)]
    assert temporal_flicker(moving) < 0.005
    assert temporal_flicker(shuffled) > 5 * temporal_flicker(moving)
    assert flicker_score(shuffled) < flicker_score(moving) < 1.0


def test_global_brightness_flicker_is_measured(moving):
    rng = np.random.default_rng(1)
    scores = []
    for amplitude in (0.0, 0.05, 0.2):
        jitter = rng.uniform(-amplitude, amplitude, (33, 1, 1, 1)).astype(np.float32)
        scores.append(temporal_flicker(np.clip(moving * 0.8 + jitter, -1, 1)))
    assert scores[0] < scores[1] < scores[2]


def test_camera_pan_is_motion_not_flicker():
    """A pan moves the texture; flicker must stay near the frozen level, below real flicker."""
    video = render(PROMPTS["pan-1"].spec, 33)[0]
    noisy = np.clip(video + np.random.default_rng(2).normal(0, 0.03, video.shape), -1, 1)
    assert temporal_flicker(video) < 0.005 < temporal_flicker(noisy.astype(np.float32))


def test_flicker_score_is_vbench_formula():
    video = np.zeros((3, 4, 4, 3), np.float32)
    video[1] = 0.2  # 0.1 on [0, 1]: 25.5 grey levels up, then back down
    assert flicker_score(video) == pytest.approx((255 - 25.5) / 255)


def test_bad_inputs_raise(moving):
    with pytest.raises(ValueError, match="2 frames"):
        temporal_flicker(moving[:1])
    with pytest.raises(ValueError, match="2 frames"):
        flicker_score(moving[:1])
    with pytest.raises(ValueError, match="odd"):
        temporal_flicker(moving, window=4)
