"""How pixel video sizes map to latent sizes: the VAE's strides and the DiT's patch."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentGeometry:
    """A model's latent geometry (`ModelSpec.geometry()`): VAE strides, DiT patch, channels."""

    temporal_stride: int
    spatial_stride: int
    patch: tuple[int, int, int]
    channels: int

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(t, h, w, c) of the latent for a video; raises a clear ValueError when impossible."""
        ts, ss = self.temporal_stride, self.spatial_stride
        if num_frames < 1 or (num_frames - 1) % ts:
            raise ValueError(f"num_frames must be {ts}k+1 (e.g. {ts * 4 + 1}), got {num_frames}")
        t = 1 + (num_frames - 1) // ts
        if t % self.patch[0]:
            raise ValueError(
                f"{t} latent frames are not divisible by the temporal patch {self.patch[0]}"
            )
        unit = ss * max(self.patch[1], self.patch[2])
        if height % unit or width % unit or height < unit or width < unit:
            raise ValueError(
                f"height and width must be positive multiples of {unit}, got {height}x{width}"
            )
        return t, height // ss, width // ss, self.channels
