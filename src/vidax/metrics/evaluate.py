"""One call for every proxy metric of a video, and a mean +- std summary over many."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from vidax.data.shapes import ClipSpec
from vidax.metrics.image import perceptual_distance, psnr, ssim
from vidax.metrics.objects import as_unit_video, track_objects
from vidax.metrics.scene import (
    caption_adherence,
    motion_fidelity,
    motion_magnitude,
    subject_consistency,
    trajectory_error,
)
from vidax.metrics.temporal import flicker_score, temporal_flicker


def evaluate(video, caption_or_spec: str | ClipSpec, reference=None) -> dict[str, float]:
    """Every proxy metric of one generated video, segmenting it once.

    Args:
        video: (t, h, w, 3) in [-1, 1].
        caption_or_spec: the prompt, or its `ClipSpec` (which also gives `trajectory_error`).
        reference: an optional (t, h, w, 3) video in [-1, 1] to compare against (e.g. the
            output of the unaccelerated sampler for the same noise); adds psnr, ssim and
            perceptual_distance.

    Returns:
        A flat dict of floats. Always: caption_adherence, caption_motion_adherence,
        motion_fidelity, subject_consistency, motion_magnitude, temporal_flicker and
        flicker_score (the last four need t >= 2, else they are NaN). With a spec:
        trajectory_error. With a reference: psnr, ssim, perceptual_distance.
    """
    x = as_unit_video(video)
    tracks = track_objects(video)
    moving = x.shape[0] >= 2
    nan = float("nan")
    out = {
        "caption_adherence": caption_adherence(video, caption_or_spec, tracks=tracks),
        "caption_motion_adherence": caption_adherence(
            video, caption_or_spec, check_motion=True, tracks=tracks
        ),
        "motion_fidelity": motion_fidelity(video, caption_or_spec, tracks=tracks)
        if moving
        else nan,
        "subject_consistency": subject_consistency(video, tracks=tracks),
        "motion_magnitude": motion_magnitude(video, tracks=tracks) if moving else nan,
        "temporal_flicker": temporal_flicker(video) if moving else nan,
        "flicker_score": flicker_score(video) if moving else nan,
    }
    if isinstance(caption_or_spec, ClipSpec):
        out["trajectory_error"] = trajectory_error(video, caption_or_spec, tracks=tracks)
    if reference is not None:
        out["psnr"] = psnr(video, reference)
        out["ssim"] = ssim(video, reference)
        out["perceptual_distance"] = perceptual_distance(video, reference)
    return out


class Summary(NamedTuple):
    """Mean and (population) standard deviation of one metric over n finite values."""

    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.std:.2g} (n={self.n})"


def summarise(results: Iterable[Mapping[str, float]]) -> dict[str, Summary]:
    """Mean +- std of every metric over a list of `evaluate` results.

    NaNs are skipped, so are infinite values (PSNR of identical videos); `n` says how many
    values each summary used. A metric with no finite value gets NaN mean and std.

    Args:
        results: dicts of floats, e.g. one `evaluate` result per prompt.

    Returns:
        {metric: Summary(mean, std, n)} over the union of the keys, sorted by name.
    """
    results = list(results)
    if not results:
        raise ValueError("summarise needs at least one result")
    keys = sorted({k for r in results for k in r})
    out = {}
    for k in keys:
        values = np.asarray([r[k] for r in results if k in r], np.float64)
        values = values[np.isfinite(values)]
        if len(values):
            out[k] = Summary(float(values.mean()), float(values.std()), len(values))
        else:
            out[k] = Summary(math.nan, math.nan, 0)
    return out
