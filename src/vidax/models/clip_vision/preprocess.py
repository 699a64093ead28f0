"""Images -> the CLIP encoder's input, as transformers' `CLIPImageProcessor` makes it.

Wan 2.1 image-to-video's `image_processor/` is OpenAI's CLIP preprocessing: resize the shorter
side to `image_size` (PIL bicubic, the longer side truncated to an integer), centre-crop a square
of `image_size`, rescale by 1/255, normalise by the OpenAI CLIP mean and std. The resize is PIL's
own (Pillow is a dependency), so the pixels match transformers' PIL backend exactly.
"""

from __future__ import annotations

import numpy as np

from vidax.models import vit
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
    size = config.image_size

    def shortest_side(height: int, width: int) -> tuple[int, int]:
        # transformers' `get_resize_output_image_size`: the shorter side becomes `size`, the
        # longer one is scaled with it and truncated.
        long = int(size * max(height, width) / min(height, width))
        return (size, long) if height <= width else (long, size)

    return vit.preprocess(
        images, config, resized=shortest_side, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD
    )
