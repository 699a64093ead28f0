import math

import numpy as np
import pytest

from vidax.data import render, sample_spec
from vidax.metrics import perceptual_distance, psnr, ssim


@pytest.fixture(scope="module")
def clip():
    return render(sample_spec(2), 6)[0]


def _noisy(x, sigma, seed=0):
    noise = np.random.default_rng(seed).normal(0, sigma, x.shape).astype(np.float32)
    return np.clip(x + noise, -1, 1)


def test_psnr(clip):
    assert psnr(clip, clip) == math.inf
    # A constant offset of 0.1 on [0, 1] (0.2 on [-1, 1]) is an MSE of 0.01: 20 dB.
    flat = np.zeros((2, 8, 8, 3), np.float32)
    assert psnr(flat, flat + 0.2) == pytest.approx(20.0, abs=1e-4)
    scores = [psnr(clip, _noisy(clip, s)) for s in (0.01, 0.05, 0.2)]
    assert scores[0] > 40 and scores[0] > scores[1] > scores[2]
    per = psnr(clip, _noisy(clip, 0.05), per_frame=True)
    assert per.shape == (6,) and np.all(np.abs(per - scores[1]) < 1.0)


def test_ssim(clip):
    assert ssim(clip, clip) == pytest.approx(1.0, abs=1e-9)
    noisy = _noisy(clip, 0.1)
    assert ssim(clip, noisy) == pytest.approx(ssim(noisy, clip), abs=1e-9)
    scores = [ssim(clip, _noisy(clip, s)) for s in (0.01, 0.05, 0.2)]
    assert 1.0 > scores[0] > scores[1] > scores[2]
    assert ssim(clip, noisy, per_frame=True).shape == (6,)
    # Constant frames: the structure term is 1 and SSIM reduces to the luminance term.
    a = np.full((1, 16, 16, 3), 2 * 0.3 - 1, np.float32)
    b = np.full((1, 16, 16, 3), 2 * 0.6 - 1, np.float32)
    c1 = 0.01**2
    want = (2 * 0.3 * 0.6 + c1) / (0.3**2 + 0.6**2 + c1)
    assert ssim(a, b) == pytest.approx(want, rel=1e-5)


def test_ssim_matches_a_direct_window_computation():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (1, 11, 11, 3)).astype(np.float32)
    b = np.clip(a + rng.normal(0, 0.3, a.shape), -1, 1).astype(np.float32)
    # An 11x11 frame has one valid window position: compute it by hand.
    k = np.arange(11) - 5
    g = np.exp(-0.5 * (k / 1.5) ** 2)
    w = np.outer(g, g) / np.outer(g, g).sum()
    x, y = (a[0].astype(np.float64) + 1) / 2, (b[0].astype(np.float64) + 1) / 2
    out = []
    for ch in range(3):
        xc, yc = x[..., ch], y[..., ch]
        mx, my = (w * xc).sum(), (w * yc).sum()
        vx, vy = (w * xc * xc).sum() - mx**2, (w * yc * yc).sum() - my**2
        cov = (w * xc * yc).sum() - mx * my
        c1, c2 = 0.01**2, 0.03**2
        out.append(((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    assert ssim(a, b) == pytest.approx(np.mean(out), rel=1e-4)


def test_perceptual_distance(clip):
    assert perceptual_distance(clip, clip) == 0.0
    # Blind to a global brightness shift, sensitive to blur and noise.
    dim = clip * 0.9
    assert perceptual_distance(dim, dim + 0.05) < 1e-6
    blur1 = (clip + np.roll(clip, 1, axis=2)) / 2
    blur2 = (blur1 + np.roll(blur1, 1, axis=1) + np.roll(blur1, 2, axis=2)) / 3
    d1, d2 = perceptual_distance(clip, blur1), perceptual_distance(clip, blur2)
    assert 0.0 < d1 < d2 <= 1.0
    assert perceptual_distance(clip, _noisy(clip, 0.02)) < perceptual_distance(
        clip, _noisy(clip, 0.2)
    )
    flat = np.zeros_like(clip)
    assert perceptual_distance(clip, flat) == pytest.approx(1.0)


def test_bad_inputs_raise(clip):
    with pytest.raises(ValueError, match="shape"):
        psnr(clip, clip[:3])
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        ssim(clip, (clip + 1) * 127.5)  # 8-bit frames
    with pytest.raises(ValueError, match="video"):
        psnr(clip[0], clip[0])
    with pytest.raises(ValueError, match="small"):
        perceptual_distance(clip[:, :8, :8], clip[:, :8, :8])
