"""Writing frames to mp4 (H.264 through imageio-ffmpeg), whole or streamed chunk by chunk;
reading images (the first frame of image-to-video)."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

import numpy as np


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """(F, H, W, 3) floats in [0, 1] -> uint8, rounding and clipping."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (F, H, W, 3), got {frames.shape}")
    return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)


@contextlib.contextmanager
def _quiet_fork():
    # imageio-ffmpeg starts ffmpeg as a subprocess; JAX warns about any fork, but exec follows
    # immediately, so no JAX state is used in the child.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        yield


class VideoWriter:
    """Appends frames to an mp4 as they are produced; the file grows while writing.

    with VideoWriter("out.mp4", fps=16) as w:
        for chunk in chunks:
            w.write(chunk)  # (f, H, W, 3) floats in [0, 1]
    """

    def __init__(self, path: str | os.PathLike, fps: int, quality: float = 8.0):
        import imageio.v2 as imageio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # macro_block_size=1: keep the exact size (yuv420p still needs even sides: we pad).
        self._writer = imageio.get_writer(
            self.path,
            fps=fps,
            codec="libx264",
            quality=quality,
            macro_block_size=1,
            ffmpeg_log_level="error",
            pixelformat="yuv420p",
        )
        self.frames_written = 0

    def write(self, frames: np.ndarray) -> None:
        with _quiet_fork():
            for frame in to_uint8(frames):
                pad = ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0))
                self._writer.append_data(np.pad(frame, pad, mode="edge"))
                self.frames_written += 1

    def close(self) -> None:
        with _quiet_fork():
            self._writer.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: int) -> Path:
    """Writes (F, H, W, 3) frames in [0, 1] to an mp4 at `path`."""
    with VideoWriter(path, fps) as writer:
        writer.write(frames)
    return writer.path


def write_frames(folder: str | os.PathLike, frames: np.ndarray) -> list[Path]:
    """Writes (F, H, W, 3) frames in [0, 1] as `folder/frame_0000.png`, ...; returns the paths."""
    import imageio.v3 as iio

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, frame in enumerate(to_uint8(frames)):
        paths.append(folder / f"frame_{i:04d}.png")
        iio.imwrite(paths[-1], frame)
    return paths


def read_video(path: str | os.PathLike) -> np.ndarray:
    """(F, H, W, 3) uint8 frames of a video file (tests and evaluation)."""
    import imageio.v3 as iio

    with _quiet_fork():
        return np.asarray(iio.imread(Path(path)))


def read_image(path: str | os.PathLike) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an image file (alpha dropped, grey expanded).

    Raises:
      FileNotFoundError: no such file.
      ValueError: not an image imageio can read.
    """
    from PIL import Image, UnidentifiedImageError  # Pillow: an imageio dependency

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{path}: not a readable image ({e})") from None


def image_pixels(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """First frames for image-to-video: (b, height, width, 3) float32 in [-1, 1].

    Args:
      image: (H, W, 3) or (b, H, W, 3), uint8 in [0, 255] or floating point in [0, 1]; resized
        to (height, width) with Lanczos when its size differs (as diffusers' `VideoProcessor`).

    Raises:
      ValueError: not an RGB image array, or floats outside [0, 1].
    """
    from PIL import Image  # Pillow: an imageio dependency

    image = np.asarray(image)
    if image.ndim == 3:
        image = image[None]
    if image.ndim != 4 or image.shape[-1] != 3 or min(image.shape[1:3]) < 1:
        raise ValueError(f"image must be (H, W, 3) or (b, H, W, 3) RGB, got shape {image.shape}")
    if np.issubdtype(image.dtype, np.floating):
        if not np.isfinite(image).all() or image.min() < 0 or image.max() > 1:
            raise ValueError("a floating-point image must hold values in [0, 1]")
        image = np.round(image * 255.0).astype(np.uint8)
    elif image.dtype != np.uint8:
        raise ValueError(f"image must be uint8 or floating point, got {image.dtype}")
    out = np.empty((image.shape[0], height, width, 3), np.float32)
    for i, frame in enumerate(image):
        if frame.shape[:2] != (height, width):
            resized = Image.fromarray(frame).resize((width, height), Image.Resampling.LANCZOS)
            frame = np.asarray(resized)
        out[i] = frame.astype(np.float32) / 127.5 - 1.0
    return out
