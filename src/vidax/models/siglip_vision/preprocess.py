"""Images -> the SigLIP encoder's input, as transformers' `SiglipImageProcessor` makes it.

HunyuanVideo-1.5 image-to-video's `feature_extractor/` (google/siglip-so400m-patch14-384's):
resize to image_size x image_size (PIL bicubic, the aspect ratio not kept, no crop), rescale by
1/255, normalise by mean 0.5 and std 0.5, i.e. to [-1, 1]. The resize is PIL's own, so the pixels
match transformers' PIL backend exactly (transformers 5 prefers a torchvision backend when
torchvision is installed, whose bicubic resize differs slightly).
"""

from __future__ import annotations

import numpy as np

from vidax.models import vit
from vidax.models.siglip_vision.config import SiglipVisionConfig

SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


def preprocess(images: np.ndarray, config: SiglipVisionConfig) -> np.ndarray:
    """Resizes and normalises RGB images for `SiglipVisionEncoder`.

    Args:
      images: (b, H, W, 3) uint8 in [0, 255], or floating point in [0, 1] (rounded to uint8
        first: the processor resizes 8-bit images).
      config: the encoder's configuration (`image_size`).

    Returns:
      (b, image_size, image_size, 3) float32 in [-1, 1], channels-last.

    Raises:
      ValueError: the images are not a (b, H, W, 3) uint8 or float array.
    """
    square = lambda height, width: (config.image_size, config.image_size)
    return vit.preprocess(images, config, resized=square, mean=SIGLIP_MEAN, std=SIGLIP_STD)
