"""Reference metrics: how close a video is to another one, frame by frame.

Both videos are (t, h, w, 3) in [-1, 1] and are compared on the [0, 1] scale (data range 1),
so the numbers match the usual 8-bit conventions (PSNR of 8-bit rounding is ~59 dB).
"""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

from vidax.metrics.objects import as_unit_video


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    x, y = as_unit_video(a), as_unit_video(b)
    if x.shape != y.shape:
        raise ValueError(f"videos differ in shape: {x.shape} vs {y.shape}")
    return x, y


@overload
def psnr(a, b, *, per_frame: Literal[False] = False) -> float: ...
@overload
def psnr(a, b, *, per_frame: Literal[True]) -> np.ndarray: ...
def psnr(a, b, *, per_frame: bool = False) -> float | np.ndarray:
    """Peak signal-to-noise ratio in dB, data range 1 on the [0, 1] scale.

    Args:
        a, b: videos (t, h, w, 3) in [-1, 1].
        per_frame: return the (t,) PSNR of each frame (a drift curve) instead of one number.

    Returns:
        10 log10(1 / MSE) over the whole video (not a mean of per-frame dB); +inf when equal.
        Higher is better; 8-bit rounding noise gives ~59 dB, visible damage is below ~30 dB.
    """
    x, y = _pair(a, b)
    x, y = x.astype(np.float64), y.astype(np.float64)
    mse = ((x - y) ** 2).mean(axis=(1, 2, 3)) if per_frame else ((x - y) ** 2).mean()
    with np.errstate(divide="ignore"):
        out = 10.0 * np.log10(1.0 / mse)
    return out if per_frame else float(out)


def _gaussian(size: int, sigma: float) -> np.ndarray:
    k = np.arange(size) - (size - 1) / 2
    g = np.exp(-0.5 * (k / sigma) ** 2)
    return g / g.sum()


def _filter(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering over axes -4 and -3 of (..., t, h, w, c)."""
    n = len(g)
    h, w = x.shape[-3] - n + 1, x.shape[-2] - n + 1
    rows = g[0] * x[..., 0:h, :, :]
    for i in range(1, n):
        rows += g[i] * x[..., i : i + h, :, :]
    out = g[0] * rows[..., 0:w, :]
    for i in range(1, n):
        out += g[i] * rows[..., i : i + w, :]
    return out


@overload
def ssim(a, b, *, per_frame: Literal[False] = False, sigma: float = 1.5) -> float: ...
@overload
def ssim(a, b, *, per_frame: Literal[True], sigma: float = 1.5) -> np.ndarray: ...
def ssim(a, b, *, per_frame: bool = False, sigma: float = 1.5) -> float | np.ndarray:
    """Structural similarity (Wang et al. 2004) with an 11-tap gaussian window (sigma 1.5).

    Computed per channel on the [0, 1] scale with K1 = 0.01, K2 = 0.03 over the 'valid' window
    positions (no padding), averaged over channels and positions of each frame, then over frames.
    The window shrinks to the frame size for frames smaller than 11 pixels.

    Args:
        a, b: videos (t, h, w, 3) in [-1, 1].
        per_frame: return the (t,) SSIM of each frame instead of the mean.

    Returns:
        SSIM in [-1, 1]; 1 exactly when a == b. Higher is better.
    """
    x, y = _pair(a, b)
    size = min(11, x.shape[1], x.shape[2])
    g = _gaussian(size, sigma)
    c1, c2 = 0.01**2, 0.03**2
    # One filtering pass over the five local moments, in float64: the variances are differences
    # of nearly equal numbers, and float32 errs by ~1e-4 of C2 on flat regions.
    x, y = x.astype(np.float64), y.astype(np.float64)
    moments = _filter(np.stack([x, y, x * x, y * y, x * y]), g)
    mx, my, xx, yy, xy = moments
    vx, vy, cov = xx - mx * mx, yy - my * my, xy - mx * my
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    per = s.mean(axis=(1, 2, 3))
    return per if per_frame else float(per.mean())


def _sobel(x: np.ndarray) -> np.ndarray:
    """(t, h-2, w-2, 3 * 2) Sobel responses of each channel (x and y)."""
    p = x
    gx = (
        (p[:, :-2, 2:] + 2 * p[:, 1:-1, 2:] + p[:, 2:, 2:])
        - (p[:, :-2, :-2] + 2 * p[:, 1:-1, :-2] + p[:, 2:, :-2])
    ) / 8
    gy = (
        (p[:, 2:, :-2] + 2 * p[:, 2:, 1:-1] + p[:, 2:, 2:])
        - (p[:, :-2, :-2] + 2 * p[:, :-2, 1:-1] + p[:, :-2, 2:])
    ) / 8
    return np.concatenate([gx, gy], axis=-1)


def _downsample(x: np.ndarray) -> np.ndarray:
    t, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2]
    return x.reshape(t, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def perceptual_distance(a, b, *, scales: int = 3) -> float:
    """A structure-sensitive distance without pretrained networks (an LPIPS stand-in).

    At each of `scales` dyadic scales (2x2 average pooling between them), the Sobel gradients of
    every colour channel are compared: d_s = sum |Ga - Gb| / (sum |Ga| + sum |Gb|), then the
    d_s are averaged. It ignores constant offsets (a global brightness shift costs 0) and
    weighs edges, texture and blur, which is what LPIPS mostly reacts to on these clips.

    Args:
        a, b: videos (t, h, w, 3) in [-1, 1].
        scales: number of scales; each must leave frames of at least 3x3 pixels.

    Returns:
        Distance in [0, 1]: 0 when the gradients agree everywhere, 1 when one video has no
        structure where the other has (or opposite gradients). Lower is better.
    """
    x, y = _pair(a, b)
    if min(x.shape[1], x.shape[2]) >> (scales - 1) < 3:
        raise ValueError(f"frames of {x.shape[1:3]} are too small for {scales} scales")
    out = []
    for s in range(scales):
        if s:
            x, y = _downsample(x), _downsample(y)
        gx, gy = _sobel(x), _sobel(y)
        den = np.abs(gx).sum() + np.abs(gy).sum()
        out.append(np.abs(gx - gy).sum() / den if den > 0 else 0.0)
    return float(np.mean(out))
