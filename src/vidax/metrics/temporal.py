"""Temporal stability of a single video: flicker, VBench style.

Videos are (t, h, w, 3) in [-1, 1]; differences are measured on the [0, 1] scale.
"""

from __future__ import annotations

import numpy as np

from vidax.metrics.objects import as_unit_video


def temporal_flicker(video, *, window: int = 5, threshold: float = 0.02) -> float:
    """Mean absolute frame-to-frame change over the static parts of a video.

    A pixel is static between frames t and t+1 when its temporal median over `window` frames
    (the slow content, robust to one-frame spikes) moves by less than `threshold` there. Real
    motion (objects, camera pan over texture) moves the median and is excluded; flicker and
    popping (noise, shuffled frames, a brief flash) leave the median alone and are counted.

    Args:
        video: (t, h, w, 3) in [-1, 1], t >= 2.
        window: odd median window in frames (clipped at the ends).
        threshold: largest change of the median, on the [0, 1] scale, for a static pixel.

    Returns:
        Mean |x[t+1] - x[t]| over static pixels and channels, on the [0, 1] scale, in [0, 1]:
        0 for a frozen video, ~0.002 for rendered ground truth, ~0.03 for shuffled frames.
        Lower is better. If fewer than 1% of the pixels are static, the mean over all pixels
        is returned instead.
    """
    x = as_unit_video(video)
    if x.shape[0] < 2:
        raise ValueError(f"temporal_flicker needs at least 2 frames, got {x.shape[0]}")
    if window < 1 or window % 2 == 0:
        raise ValueError(f"window must be a positive odd number, got {window}")
    luma = x.mean(-1)
    half = window // 2
    padded = np.concatenate([np.repeat(luma[:1], half, 0), luma, np.repeat(luma[-1:], half, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window, axis=0)
    median = np.median(windows, axis=-1)  # (t, h, w)
    static = np.abs(np.diff(median, axis=0)) < threshold  # (t-1, h, w)
    change = np.abs(np.diff(x, axis=0)).mean(-1)
    if static.mean() < 0.01:
        return float(change.mean())
    return float(change[static].mean())


def flicker_score(video) -> float:
    """VBench's temporal-flickering score: (255 - MAE) / 255 over consecutive frames.

    MAE is the mean absolute difference of consecutive frames over all pixels and channels on
    the 0-255 scale, averaged over frame pairs (VBench applies it to static-scene prompts, where
    any change is flicker).

    Args:
        video: (t, h, w, 3) in [-1, 1], t >= 2.

    Returns:
        Score in [0, 1]: 1 for a frozen video, lower with more change. Higher is better.
    """
    x = as_unit_video(video)
    if x.shape[0] < 2:
        raise ValueError(f"flicker_score needs at least 2 frames, got {x.shape[0]}")
    mae = np.abs(np.diff(x.astype(np.float64) * 255.0, axis=0)).mean()
    return float((255.0 - mae) / 255.0)
