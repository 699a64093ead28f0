"""`vidax generate --model tiny-causal --stream`: write the video chunk by chunk as it is made.

`vidax.cli` calls `stream_generate` for causal presets (`vidax.models.is_causal(model)`), drives its progress
bar from `on_chunk`, and reports `ValueError`s as one-line errors:

    result = stream_generate("tiny-causal", "a red circle moving right", Path("out.mp4"),
                             frames=81, seed=0, on_chunk=bar.update)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from vidax.data import read_prompt
from vidax.forcing.model import CausalWan
from vidax.forcing.rollout import ChunkStepper, StreamDecoder
from vidax.forcing.weights import load_causal
from vidax.models.geometry import LatentGeometry
from vidax.models.registry import CausalPreset, get_causal
from vidax.text import embed_prompts
from vidax.video import VideoWriter

# on_chunk(done_chunks, total_chunks, frames_written)
ChunkCallback = Callable[[int, int, int], None]
# on_frames(pixels): the chunk's decoded frames (f, H, W, 3) float32 in [0, 1]
FramesCallback = Callable[[np.ndarray], None]


@dataclasses.dataclass(frozen=True)
class StreamResult:
    """What a streamed generation wrote.

    path: the mp4; frames: pixel frames written; chunks: chunks generated;
    chunk_seconds: wall time of each chunk (generation + decoding + writing);
    latents: (t, h, w, c) float32 latents of the whole video.
    """

    path: Path
    frames: int
    chunks: int
    chunk_seconds: tuple[float, ...]
    latents: np.ndarray


def stream_generate(
    model: str | CausalPreset = "tiny-causal",
    prompt: str = "",
    out: str | Path = "out.mp4",
    *,
    frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    seed: int = 0,
    attention: str = "sparse",
    weights: str | Path | None = None,
    forcing_overrides: dict | None = None,
    transformer: CausalWan | None = None,
    vae=None,
    on_chunk: ChunkCallback | None = None,
    on_frames: FramesCallback | None = None,
    random_weights: bool = False,
) -> StreamResult:
    """Generates a video chunk by chunk, appending each decoded chunk to `out` as it is made.

    Args:
      model: causal preset or its name (see `vidax.models.names()`).
      prompt: text prompt (the base model's text encoder).
      out: mp4 path; the file grows while the video is generated.
      frames: pixel frames, 4k + 1 whose latent frames are a multiple of the chunk (default:
        the preset's).
      height, width: pixel size (default: the base model's).
      seed: noise seed.
      attention: "sparse" (Sparse Forcing) or "dense" (Self-Forcing baseline).
      weights: causal weights file (default: the preset's shipped weights).
      forcing_overrides: `ForcingConfig` fields to replace (cache and budget experiments).
      transformer, vae: already-built models (skip loading).
      on_chunk: called after each chunk is written with (done, total, frames_written).
      on_frames: called with each chunk's decoded frames (f, H, W, 3) as soon as they exist,
        before they are written (a server shows them while the rest is generated).
      random_weights: run a part without weights on random initialisation (warns) instead of
        failing.

    Raises:
      ValueError: with a one-line reason for impossible sizes or cache/budget settings (a
        budget larger than the window, a chunk that does not divide the latent frames, ...),
        or for a chunk whose latents are not finite.
      CheckpointError: missing weights (without `random_weights`).
    """
    preset = get_causal(model) if isinstance(model, str) else model
    forcing = preset.forcing(attention, forcing_overrides)
    spec = preset.spec
    d = spec.defaults
    frames = preset.num_frames if frames is None else frames
    height = d.height if height is None else height
    width = d.width if width is None else width
    if vae is None:
        if spec.vae is None:
            raise ValueError(f"model {preset.name!r} has no VAE to decode a stream with")
        geo = spec.geometry()
    else:
        geo = LatentGeometry(
            temporal_stride=vae.config.temporal_factor,
            spatial_stride=vae.config.spatial_factor,
            patch=tuple(spec.config.patch_size),
            channels=vae.config.z_dim,
        )
    _, h, w, c = geo.latent_shape(frames, height, width)
    num_chunks = _num_chunks(spec, geo, forcing, frames, height, width)
    causal = transformer
    if causal is None:
        causal = load_causal(preset, attention, weights, random_weights=random_weights)
    vae = vae if vae is not None else spec.load_vae(random_weights=random_weights)
    layout = causal.layout(forcing, (h, w))
    text = embed_prompts(spec, [read_prompt(spec, prompt)], random_weights=random_weights)
    context = text.embeds * text.mask[..., None].astype(text.embeds.dtype)
    stepper = ChunkStepper(causal, layout, latent_hw=(h, w), channels=c)
    decoder = StreamDecoder(vae)
    key = jax.random.key(seed)
    cache = stepper.init(1)
    seconds, latents = [], []
    with VideoWriter(out, d.fps) as writer:
        for i in range(num_chunks):
            start = time.perf_counter()
            x0, cache = stepper(cache, i, key, context)
            latents.append(np.asarray(x0[0]))  # the chunk is read back anyway: a free check
            if not np.isfinite(latents[-1]).all():
                raise ValueError(
                    f"sampling produced non-finite latents (NaN or inf) in chunk {i + 1} of "
                    f"{num_chunks}: check the weights"
                )
            pixels = decoder(x0)
            if on_frames is not None:
                on_frames(pixels[0])
            writer.write(pixels[0])
            seconds.append(time.perf_counter() - start)
            if on_chunk is not None:
                on_chunk(i + 1, num_chunks, writer.frames_written)
    return StreamResult(
        path=Path(out),
        frames=writer.frames_written,
        chunks=num_chunks,
        chunk_seconds=tuple(seconds),
        latents=np.concatenate(latents, axis=0),
    )


def check(
    model: str | CausalPreset,
    *,
    frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    attention: str = "sparse",
    forcing_overrides: dict | None = None,
) -> int:
    """Validates a streamed generation's settings without loading anything (a server checks a
    request before queueing it); returns the number of chunks.

    Raises:
      ValueError: the one-line reason `stream_generate` would give.
    """
    preset = get_causal(model) if isinstance(model, str) else model
    forcing = preset.forcing(attention, forcing_overrides)
    spec, d = preset.spec, preset.spec.defaults
    frames = preset.num_frames if frames is None else frames
    height = d.height if height is None else height
    width = d.width if width is None else width
    return _num_chunks(spec, spec.geometry(), forcing, frames, height, width)


def _num_chunks(spec, geo, forcing, frames: int, height: int, width: int) -> int:
    """Chunks of a video; a ValueError for sizes, chunkings, budgets that cannot work."""
    t, h, w, _ = geo.latent_shape(frames, height, width)
    try:
        num_chunks = forcing.num_chunks(t)
    except ValueError as e:
        del e
        step = geo.temporal_stride * forcing.chunk_frames
        ok = [step * n - (geo.temporal_stride - 1) for n in (1, 2, 3)]
        raise ValueError(
            f"--frames {frames} gives {t} latent frames, which chunks of {forcing.chunk_frames} "
            f"do not divide: use {step}n - {geo.temporal_stride - 1} frames "
            f"({', '.join(map(str, ok))}, ...)"
        ) from None
    _, ph, pw = spec.config.patch_size
    forcing.layout((h // ph, w // pw))  # block size and budgets, before anything is loaded
    return num_chunks
