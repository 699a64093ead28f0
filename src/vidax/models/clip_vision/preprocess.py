"""Images -> the CLIP encoder's input, as transformers' `CLIPImageProcessor` makes it.

Wan 2.1 image-to-video's `image_processor/` is OpenAI's CLIP preprocessing: resize the shorter
side to `image_size` (PIL bicubic, the longer side truncated to an integer), centre-crop a square
of `image_size`, rescale by 1/255, normalise by the OpenAI CLIP mean and std. The resize is PIL's
own (Pillow is a dependency), so the pixels match transformers' PIL backend exactly.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from vidax.models.clip_vision.config import CLIPVisionConfig

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def preprocess(images: np.ndarray, config: CLIPVisionConfig) -> np.ndarray:
    """Resizes, centre-crops and normalises RGB images for `CLIPVisionEncoder`.

    Args:
      images: (b, H, W, 3) uint8 in [0, 255], or floating point in [0, 1] (rounded to uint8
        first: the processor resizes 8-bit images).
      config: the encoder's configuration (`image_size`).

    Returns:
      (b, image_size, image_size, 3) float32, channels-last.

    Raises:
      ValueError: the images are not a (b, H, W, 3) uint8 or float array.
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or config.num_channels != 3:
        raise ValueError(
            f"images must be (b, H, W, 3) RGB for a 3-channel encoder, got shape {images.shape} "
            f"for num_channels={config.num_channels}"
        )
    if np.issubdtype(images.dtype, np.floating):
        images = np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)
    elif images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 or floating point, got {images.dtype}")
    size = config.image_size
    height, width = images.shape[1:3]
    # transformers' `get_resize_output_image_size`: the shorter side becomes `size`, the longer
    # one is scaled with it and truncated.
    short, long = min(height, width), max(height, width)
    long = int(size * long / short)
    new_height, new_width = (size, long) if height <= width else (long, size)
    top, left = (new_height - size) // 2, (new_width - size) // 2
    out = np.empty((images.shape[0], size, size, 3), np.float32)
    for i, image in enumerate(images):
        resized = Image.fromarray(image).resize((new_width, new_height), Image.Resampling.BICUBIC)
        crop = np.asarray(resized)[top : top + size, left : left + size]
        out[i] = (crop.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(OPENAI_CLIP_MEAN, np.float32)
    std = np.asarray(OPENAI_CLIP_STD, np.float32)
    return (out - mean) / std
