"""Stages every patchified video DiT (Wan, HunyuanVideo 1 and 1.5) shares.

Each family keeps its own layers (their names are its checkpoint's keys); `VideoDiT` holds the
logic around them: patchify and embed, RoPE angles for a token grid, the modulated output head
with unpatchify, and the forward pass chaining the stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Float

from vidax.nn import Linear, rope_angles, video_positions
from vidax.nn.layers import layer_norm, modulate
from vidax.sharding import shard


class MLPEmbedder(nnx.Module):
    """linear_2(act(linear_1(x))): the timestep, guidance and text embedders."""

    def __init__(
        self,
        in_dim: int,
        dim: int,
        *,
        in_axis: str,
        activation: Callable[[jax.Array], jax.Array] = jax.nn.silu,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.linear_1 = Linear(in_dim, dim, axes=(in_axis, "embed"), **kw)
        self.linear_2 = Linear(dim, dim, axes=("embed", None), **kw)
        self.activation = activation

    def __call__(self, x: Float[Array, "... e"]) -> Float[Array, "... d"]:
        return self.linear_2(self.activation(self.linear_1(x)))


class VideoDiT(nnx.Module):
    """The stages every family's transformer shares, chained by `__call__`:

        tokens, grid = model.embed(x)                    # patchify
        cond = model.condition(...)                      # the family's conditioning
        tokens = model.run_blocks(tokens, cond, model.rope(grid, positions))
        x = model.unembed(tokens, cond, grid)            # modulated head, unpatchify

    A family names its patch embedding layer (`PATCH_EMBEDDING`, its checkpoint's key) and its
    output projection `proj_out`, and defines `condition`, `run_blocks` and `unembed` (which
    calls `_head` with its modulation).
    """

    config: Any
    proj_out: Linear
    PATCH_EMBEDDING: ClassVar[str]
    # How a token's output features are ordered before unpatchify, in einops terms.
    OUT_FEATURES: ClassVar[str] = "(pt ph pw c)"

    def embed(
        self, x: Float[Array, "b t h w c"]
    ) -> tuple[Float[Array, "b l d"], tuple[int, int, int]]:
        """Patchifies the latent into tokens; returns them and the token grid (t', h', w').

        Raises:
          ValueError: `x` is not (b, t, h, w, in_channels) with (t, h, w) divisible by the
            patch.
        """
        c = self.config
        if x.ndim != 5:
            raise ValueError(f"expected a (b, t, h, w, c) latent, got shape {x.shape}")
        _, t, h, w, ch = x.shape
        pt, ph, pw = c.patch_size
        if ch != c.in_channels:
            raise ValueError(
                f"expected {c.in_channels} latent channels, got input of shape {x.shape}"
            )
        if t % pt or h % ph or w % pw:
            raise ValueError(f"latent {(t, h, w)} is not divisible by patch size {c.patch_size}")
        patches = rearrange(
            x, "b (t pt) (h ph) (w pw) c -> b (t h w) (pt ph pw c)", pt=pt, ph=ph, pw=pw
        )
        tokens = getattr(self, self.PATCH_EMBEDDING)(patches.astype(c.compute_dtype))
        return shard(tokens, ("batch", "tokens", "embed")), (t // pt, h // ph, w // pw)

    def rope(
        self, grid: tuple[int, int, int], positions: Float[Array, "l 3"] | None = None
    ) -> Float[Array, "l k/2"]:
        """RoPE angles for a token grid; `positions` (l, 3) overrides the integer grid.

        Raises:
          ValueError: `positions` does not hold one (t, h, w) position per token of the grid.
        """
        c = self.config
        if positions is None:
            positions = video_positions(*grid)
        elif positions.shape[-2:] != (grid[0] * grid[1] * grid[2], 3):
            raise ValueError(
                f"positions must be ({grid[0] * grid[1] * grid[2]}, 3) for token grid {grid}, "
                f"got {positions.shape}"
            )
        return rope_angles(positions, c.rope_axes_dims, c.rope_theta)

    def condition(self, *args: Any, **kwargs: Any) -> Any:
        """The family's per-call conditioning (timestep embedding, text, ...)."""
        raise NotImplementedError

    def run_blocks(self, tokens: Float[Array, "b l d"], cond: Any, angles: Any) -> jax.Array:
        """The family's blocks over the video tokens."""
        raise NotImplementedError

    def unembed(
        self, tokens: Float[Array, "b l d"], cond: Any, grid: tuple[int, int, int]
    ) -> Float[Array, "b t h w c"]:
        """The family's output head: `_head` with its modulation."""
        raise NotImplementedError

    def _head(
        self,
        tokens: Float[Array, "b l d"],
        modulation: tuple[jax.Array, jax.Array],
        grid: tuple[int, int, int],
    ) -> Float[Array, "b t h w c"]:
        """The modulated output head, then unpatchify back to a channels-last latent (float32).

        Args:
          modulation: (shift, scale), each (b, 1|l, d).
        """
        c = self.config
        shift, scale = modulation
        h = modulate(layer_norm(tokens, c.eps), shift, scale).astype(c.compute_dtype)
        out = self.proj_out(h).astype(jnp.float32)
        pt, ph, pw = c.patch_size
        t, hh, ww = grid
        return rearrange(
            out,
            f"b (t h w) {self.OUT_FEATURES} -> b (t pt) (h ph) (w pw) c",
            t=t,
            h=hh,
            w=ww,
            pt=pt,
            ph=ph,
            pw=pw,
        )

    def __call__(
        self,
        x: Float[Array, "b t h w c"],
        *args: Any,
        positions: Float[Array, "l 3"] | None = None,
        condition: Float[Array, "b t h w k"] | None = None,
        **kwargs: Any,
    ) -> Float[Array, "b t h w c"]:
        """Predicts the flow for latent `x` at a timestep (sigma * 1000).

        Args:
          x: (b, t, h, w, out_channels) noisy latent, or the whole model input
            (in_channels: latent and condition channels already concatenated; condition None).
          *args, **kwargs: the family's conditioning inputs, as its `condition` takes them.
          positions: optional (l, 3) RoPE positions of the token grid (default: integer grid).
          condition: (b, t, h, w, config.condition_channels) channels concatenated to `x`
            (image-to-video: image latents and first-frame mask, on x's grid); None: zeros
            (text-to-video on a model that also does image-to-video, as diffusers does).

        Returns:
          (b, t, h, w, out_channels) float32 flow prediction.
        """
        tokens, grid = self.embed(with_condition(self.config, x, condition))
        cond = self.condition(*args, **kwargs)
        tokens = self.run_blocks(tokens, cond, self.rope(grid, positions))
        return self.unembed(tokens, cond, grid)


def with_condition(
    config: Any, x: Float[Array, "b t h w c"], condition: Float[Array, "b t h w k"] | None
) -> Float[Array, "b t h w c+k"]:
    """The model input: latent `x` with the condition channels the config expects
    (`condition_channels`) concatenated (zeros when `condition` is None; x as it is when it
    already has all `in_channels`).

    Raises:
      ValueError: `condition` given to a model without condition channels, or not of x's grid
        with the expected channels.
    """
    k = config.condition_channels
    if k and x.shape[-1] not in (config.out_channels, config.in_channels):
        raise ValueError(
            f"expected a latent of {config.out_channels} channels (or the whole "
            f"{config.in_channels}-channel model input), got shape {x.shape}"
        )
    if condition is None:
        if k == 0 or x.shape[-1] == config.in_channels:
            return x
        return jnp.concatenate([x, jnp.zeros((*x.shape[:-1], k), x.dtype)], axis=-1)
    if k == 0:
        raise ValueError("condition= given to a model without condition channels")
    if x.shape[-1] != config.out_channels:
        raise ValueError(f"x already has all {config.in_channels} channels: no condition= too")
    if condition.shape != (*x.shape[:-1], k):
        raise ValueError(
            f"condition must be {(*x.shape[:-1], k)} (x's grid, {k} channels), got "
            f"{condition.shape}"
        )
    return jnp.concatenate([x, condition.astype(x.dtype)], axis=-1)


def first_frame_condition(
    encode: Callable[[jax.Array], jax.Array],
    pixels: Float[Array, "b H W 3"],
    latent_frames: int,
    channels: int,
) -> Float[Array, "b t h w k"]:
    """The condition of a model given its first latent frame (HunyuanVideo-1.5 I2V, Wan 2.2
    TI2V): [latents, mask], the image encoded alone on latent frame 0 and zeros after it, and
    one mask channel that is 1 on frame 0 and 0 elsewhere.

    Args:
      encode: video (b, F, H, W, 3) in [-1, 1] -> the VAE's (scaled) latents (b, t, h, w, c).
      pixels: (b, H, W, 3) first frames in [-1, 1].
      latent_frames: t, the latent frames of the video.
      channels: the model's condition channels (`condition_channels`), c + 1.

    Raises:
      ValueError: the VAE's latent channels plus the mask are not `channels`.
    """
    first = encode(pixels[:, None])  # (b, 1, h, w, c)
    if first.shape[-1] + 1 != channels:
        raise ValueError(
            f"the VAE's {first.shape[-1]} latent channels and a mask are not the model's "
            f"{channels} condition channels"
        )
    latents = jnp.zeros((first.shape[0], latent_frames, *first.shape[2:]), first.dtype)
    latents = latents.at[:, :1].set(first)
    mask = jnp.zeros((*latents.shape[:-1], 1), latents.dtype).at[:, 0].set(1.0)
    return jnp.concatenate([latents, mask], axis=-1)
