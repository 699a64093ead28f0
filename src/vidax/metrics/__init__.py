"""VBench-style proxy metrics that need no pretrained networks.

Every metric takes videos (t, h, w, 3) in [-1, 1] (the range of `vidax.data.render` and of
the decoders) and works on the [0, 1] scale internally. The object-level metrics read the
palette shapes of `vidax.data.shapes` clips and judge them against the caption or `ClipSpec`.

- Reference fidelity: `psnr`, `ssim`, `perceptual_distance`.
- Temporal stability: `temporal_flicker` (static-region MAE), `flicker_score` (VBench).
- Objects: `palette_labels`, `find_blobs`, `track_objects`.
- Scene: `subject_consistency` (its per-object terms: `subject_scores`), `motion_fidelity`,
  `motion_magnitude`, `trajectory_error`, `caption_adherence`, `shapes_read` (asked vs read
  shape per caption object).
- `evaluate(video, caption_or_spec, reference=None)` bundles them; `summarise` averages.
"""

from vidax.metrics.evaluate import Summary, evaluate, summarise
from vidax.metrics.image import perceptual_distance, psnr, ssim
from vidax.metrics.objects import (
    COLOURS,
    Blobs,
    Track,
    Tracks,
    find_blobs,
    palette_labels,
    track_objects,
)
from vidax.metrics.scene import (
    caption_adherence,
    motion_fidelity,
    motion_magnitude,
    shapes_read,
    subject_consistency,
    subject_scores,
    trajectory_error,
)
from vidax.metrics.temporal import flicker_score, temporal_flicker

__all__ = [
    "COLOURS",
    "Blobs",
    "Summary",
    "Track",
    "Tracks",
    "caption_adherence",
    "evaluate",
    "find_blobs",
    "flicker_score",
    "motion_fidelity",
    "motion_magnitude",
    "palette_labels",
    "perceptual_distance",
    "psnr",
    "shapes_read",
    "ssim",
    "subject_consistency",
    "subject_scores",
    "summarise",
    "temporal_flicker",
    "track_objects",
    "trajectory_error",
]
