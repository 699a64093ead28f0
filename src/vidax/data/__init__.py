"""Synthetic text-to-video data: procedural coloured-shape clips with ground truth.

- `shapes`: `ClipSpec`/`ObjectSpec`, `sample_spec`, `render`, `caption`/`parse_caption`,
  `EVAL_PROMPTS` (the fixed set) and `random_eval_prompts` (fresh draws, `categorise`d).
- `grammar`: `read_prompt`, a prompt in the caption grammar a model was trained on.
- `loader`: `ClipLoader`, an infinite, seeded batch iterator resumable from (seed, step), and
  `shard_batch`, which places a batch on a mesh's ("data", "fsdp") axes.
"""

from vidax.data.grammar import read_prompt
from vidax.data.loader import (
    BATCH_AXES,
    ClipLoader,
    LoaderConfig,
    batch_rows,
    batch_sharding,
    clip_at,
    shard_batch,
)
from vidax.data.shapes import (
    DIRECTIONS,
    EVAL_PROMPTS,
    MOTIONS,
    PALETTE,
    PAN_SPEED,
    PANS,
    SHAPES,
    SPEED,
    CaptionObject,
    ClipSpec,
    EvalPrompt,
    ObjectSpec,
    camera_velocity,
    canonical_caption,
    caption,
    categorise,
    extent,
    parse_caption,
    parse_pan,
    random_eval_prompts,
    render,
    sample_spec,
    trajectories,
)

__all__ = [
    "BATCH_AXES",
    "DIRECTIONS",
    "EVAL_PROMPTS",
    "MOTIONS",
    "PALETTE",
    "PANS",
    "PAN_SPEED",
    "SHAPES",
    "SPEED",
    "CaptionObject",
    "ClipLoader",
    "ClipSpec",
    "EvalPrompt",
    "LoaderConfig",
    "ObjectSpec",
    "batch_rows",
    "batch_sharding",
    "camera_velocity",
    "canonical_caption",
    "caption",
    "categorise",
    "clip_at",
    "extent",
    "parse_caption",
    "parse_pan",
    "random_eval_prompts",
    "read_prompt",
    "render",
    "sample_spec",
    "shard_batch",
    "trajectories",
]
