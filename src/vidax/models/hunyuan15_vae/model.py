"""The HunyuanVideo-1.5 VAE (diffusers `AutoencoderKLHunyuanVideo15`) in NNX, channels-last.

Every layer is causal in time: causal convs (replicate padding), per-position RMS norms,
pixel-(un)shuffle resamplers that treat frame 0 alone, and frame-causal attention. So the
high-resolution part of each network streams through the clip in chunks under a `lax.scan`
whose carry is the causal-conv cache (as Wan's VAE does; diffusers runs whole clips), and only
the latent-resolution part (the middle blocks with their attention, where activations are
small) runs on the whole clip at once:

  encode: [conv_in, down blocks] chunk by chunk (frame 0, then 4 frames -> 1 latent frame),
          then [mid block, norm_out, conv_out + shortcut] on the whole latent clip;
  decode: [conv_in + shortcut, mid block] on the whole latent clip, then [up blocks,
          norm_out, conv_out] chunk by chunk (latent frame 0, then `latents_per_step`).

The result equals whole-clip evaluation exactly; peak memory does not grow with clip length
beyond the latent-resolution activations and the output. Spatial tiles (`Tiling.size`) bound
it in height and width as diffusers' tiling does.

Modules of the streamed parts are `(x, cache) -> (y, cache)`; `cache is None` marks the chunk
that starts the clip (its first frame is the causal "image" frame).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.hunyuan15_vae.config import ENCODE_CHUNK, HunyuanVideo15VAEConfig
from vidax.models.hunyuan_vae.config import Tiling
from vidax.models.hunyuan_vae.model import CausalConv3d, frame_causal_attention, tiled_2d
from vidax.models.video_vae import (
    VIDEO_AXES,
    ChannelRMSNorm,
    VideoVAE,
    run_chunked,
    stream_stage,
    stream_through,
)
from vidax.sharding import shard

Cache = Any  # a pytree of arrays mirroring the module tree; None at the clip's start


def _pack(x: Float[Array, "b t h w c"], rt: int) -> Float[Array, "b t2 h2 w2 c2"]:
    """(b, rt f, 2 h, 2 w, c) -> (b, f, h, w, rt * 2 * 2 * c), diffusers' channel order."""
    b, t, h, w, c = x.shape
    x = x.reshape(b, t // rt, rt, h // 2, 2, w // 2, 2, c)
    return x.transpose(0, 1, 3, 5, 2, 4, 6, 7).reshape(b, t // rt, h // 2, w // 2, -1)


def _unpack(x: Float[Array, "b t h w c"], rt: int) -> Float[Array, "b t2 h2 w2 c2"]:
    """(b, f, h, w, rt * 2 * 2 * c) -> (b, rt f, 2 h, 2 w, c), the inverse of `_pack`."""
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h, w, rt, 2, 2, c // (4 * rt))
    return x.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, t * rt, 2 * h, 2 * w, -1)


def _group_mean(x: Float[Array, "... c"], size: int) -> Float[Array, "... c2"]:
    """Means of consecutive groups of `size` channels (diffusers' `view(..., size).mean`)."""
    return jnp.mean(x.reshape(*x.shape[:-1], -1, size), axis=-1)


def _by_frame(fn_first, fn_rest, x: Array, first: bool) -> Array:
    """fn_first on frame 0 and fn_rest on the others when x starts the clip, else fn_rest."""
    if not first:
        return fn_rest(x)
    parts = [fn_first(x[:, :1])]
    if x.shape[1] > 1:
        parts.append(fn_rest(x[:, 1:]))
    return jnp.concatenate(parts, axis=1)


class ResnetBlock(nnx.Module):
    """conv2(silu(norm2(conv1(silu(norm1 x))))) + shortcut(x); RMS norms, causal convs."""

    def __init__(self, in_dim: int, out_dim: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm1 = ChannelRMSNorm(in_dim, param_dtype=param_dtype)
        self.conv1 = CausalConv3d(in_dim, out_dim, **kw)
        self.norm2 = ChannelRMSNorm(out_dim, param_dtype=param_dtype)
        self.conv2 = CausalConv3d(out_dim, out_dim, **kw)
        self.conv_shortcut = CausalConv3d(in_dim, out_dim, 1, **kw) if in_dim != out_dim else None

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        c1, c2 = (None, None) if cache is None else cache
        y, c1 = self.conv1.chunk(jax.nn.silu(self.norm1(x)), c1)
        y, c2 = self.conv2.chunk(jax.nn.silu(self.norm2(y)), c2)
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return y + shortcut.astype(y.dtype), (c1, c2)


class AttentionBlock(nnx.Module):
    """x + proj_out(attn(norm x)): one head as wide as the channels, frame-causal, whole clip."""

    def __init__(self, dim: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = ChannelRMSNorm(dim, param_dtype=param_dtype)
        self.to_q = CausalConv3d(dim, dim, 1, **kw)
        self.to_k = CausalConv3d(dim, dim, 1, **kw)
        self.to_v = CausalConv3d(dim, dim, 1, **kw)
        self.proj_out = CausalConv3d(dim, dim, 1, **kw)

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        b, t, h, w, c = x.shape
        y = self.norm(x)
        q, k, v = (f(y).reshape(b, t * h * w, 1, c) for f in (self.to_q, self.to_k, self.to_v))
        o = frame_causal_attention(q, k, v, t).reshape(x.shape)
        return x + self.proj_out(o).astype(x.dtype)


class MidBlock(nnx.Module):
    """Residual block, attention, residual block, on a whole (latent-resolution) clip."""

    def __init__(self, dim: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.resnets = nnx.List([ResnetBlock(dim, dim, **kw) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, **kw)])

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        x, _ = self.resnets[0](x, None)
        x = self.attentions[0](x)
        return self.resnets[1](x, None)[0]


class _Resample(nnx.Module):
    """A causal conv whose channels fold into (`Downsample`) or unfold from (`Upsample`) each
    2x2 pixel block, and with `temporal` each frame pair (factor 8, else 4)."""

    UP: ClassVar[bool]

    def __init__(self, in_dim: int, out_dim: int, temporal: bool, *, dtype, param_dtype, rngs):
        self.factor = 8 if temporal else 4
        conv_out = out_dim * self.factor if self.UP else out_dim // self.factor
        self.conv = CausalConv3d(in_dim, conv_out, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.temporal = temporal
        # The shortcut's channel ratio: repeats of each channel (up), or channels averaged per
        # group (down).
        wide, narrow = (out_dim, in_dim) if self.UP else (in_dim, out_dim)
        self.ratio = self.factor * wide // narrow


class Downsample(_Resample):
    """Causal conv to out / factor channels, pixel-unshuffled, plus channel-averaged shortcut.

    With `temporal`, frame pairs fold into channels too; the clip's first frame folds alone
    (its channels doubled to match).
    """

    UP = False

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        first = cache is None
        h, cache = self.conv.chunk(x, cache)
        if not self.temporal:
            return _pack(h, 1) + _group_mean(_pack(x, 1), self.ratio).astype(h.dtype), cache
        h = _by_frame(lambda f: jnp.tile(_pack(f, 1), 2), lambda r: _pack(r, 2), h, first)
        shortcut = _by_frame(
            lambda f: _group_mean(_pack(f, 1), self.ratio // 2),
            lambda r: _group_mean(_pack(r, 2), self.ratio),
            x,
            first,
        )
        return h + shortcut.astype(h.dtype), cache


class Upsample(_Resample):
    """Causal conv to out * factor channels, pixel-shuffled, plus channel-repeated shortcut.

    With `temporal`, channels unfold into frame pairs too, except for the clip's first frame,
    which unfolds alone (keeping the first half of its channels).
    """

    UP = True

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        first = cache is None
        h, cache = self.conv.chunk(x, cache)
        if not self.temporal:
            shortcut = _unpack(jnp.repeat(x, self.ratio, axis=-1), 1)
            return _unpack(h, 1) + shortcut.astype(h.dtype), cache

        def first_frame(f):
            f = _unpack(f, 1)
            return f[..., : f.shape[-1] // 2]

        h = _by_frame(first_frame, lambda r: _unpack(r, 2), h, first)
        shortcut = _by_frame(
            lambda f: jnp.repeat(_unpack(f, 1), self.ratio // 2, axis=-1),
            lambda r: jnp.repeat(_unpack(r, 2), self.ratio, axis=-1),
            x,
            first,
        )
        return h + shortcut.astype(h.dtype), cache


class Stage(nnx.Module):
    """`num` residual blocks, then an optional resampler (diffusers' down/up block)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num: int,
        resample: tuple[type[Downsample] | type[Upsample], int, bool] | None,
        *,
        dtype,
        param_dtype,
        rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.resnets = nnx.List(
            [ResnetBlock(in_dim if j == 0 else out_dim, out_dim, **kw) for j in range(num)]
        )
        if resample is None:
            self.resampler = None
        else:
            cls, channels, temporal = resample
            self.resampler = cls(out_dim, channels, temporal, **kw)

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        return stream_stage(self.resnets, self.resampler, x, cache)


def _kw(config: HunyuanVideo15VAEConfig, rngs: nnx.Rngs) -> dict:
    return dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype), rngs=rngs)


def _resample(cls, spec):
    return None if spec is None else (cls, *spec)


class Encoder(nnx.Module):
    """Pixels (b, T, H, W, c_in) -> moments (b, t, H / s, W / s, 2 z)."""

    def __init__(self, config: HunyuanVideo15VAEConfig, *, rngs: nnx.Rngs):
        kw = _kw(config, rngs)
        c = config.block_out_channels
        self.conv_in = CausalConv3d(config.in_channels, c[0], **kw)
        self.down_blocks = nnx.List(
            [
                Stage(i, o, config.layers_per_block, _resample(Downsample, r), **kw)
                for i, o, r in config.encoder_layout
            ]
        )
        self.mid_block = MidBlock(c[-1], **kw)
        self.norm_out = ChannelRMSNorm(c[-1], param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(c[-1], 2 * config.z_dim, **kw)
        self.group = c[-1] // (2 * config.z_dim)

    def stream(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        """conv_in and the down blocks on one chunk of the clip."""
        c_in, c_blocks = (None, None) if cache is None else cache
        x, c_in = self.conv_in.chunk(x, c_in)
        x, c_blocks = stream_through(self.down_blocks, x, c_blocks)
        return x, (c_in, c_blocks)

    def head(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w z2"]:
        """The latent-resolution rest on the whole clip."""
        x = self.mid_block(x)
        shortcut = _group_mean(x, self.group)
        return self.conv_out(jax.nn.silu(self.norm_out(x))) + shortcut.astype(x.dtype)


class Decoder(nnx.Module):
    """Latents (b, t, h, w, z) -> pixels (b, 1 + 4 (t - 1), h s, w s, c_out)."""

    def __init__(self, config: HunyuanVideo15VAEConfig, *, rngs: nnx.Rngs):
        kw = _kw(config, rngs)
        c = config.block_out_channels[::-1]
        self.conv_in = CausalConv3d(config.z_dim, c[0], **kw)
        self.mid_block = MidBlock(c[0], **kw)
        self.up_blocks = nnx.List(
            [
                Stage(i, o, config.layers_per_block + 1, _resample(Upsample, r), **kw)
                for i, o, r in config.decoder_layout
            ]
        )
        self.norm_out = ChannelRMSNorm(c[-1], param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(c[-1], config.out_channels, **kw)
        self.repeat = c[0] // config.z_dim

    def stem(self, z: Float[Array, "b t h w z"]) -> Float[Array, "b t h w c"]:
        """The latent-resolution start on the whole clip."""
        x = self.conv_in(z) + jnp.repeat(z, self.repeat, axis=-1).astype(self.conv_in.dtype)
        return self.mid_block(x)

    def stream(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        """The up blocks, norm_out and conv_out on one chunk of the clip."""
        c_blocks, c_out = (None, None) if cache is None else cache
        x, c_blocks = stream_through(self.up_blocks, x, c_blocks)
        x, c_out = self.conv_out.chunk(jax.nn.silu(self.norm_out(x)), c_out)
        return x, (c_blocks, c_out)


class HunyuanVideo15VAE(VideoVAE):
    """The HunyuanVideo-1.5 VAE: 16x spatial, 4x temporal, causal, with a Gaussian latent.

    Latents are *scaled*: `encode` returns mu * scaling_factor and `decode` divides by it, as
    the diffusers pipelines do around the VAE. `moments` and `decode_raw` are the traceable,
    unscaled pieces.
    """

    def __init__(self, config: HunyuanVideo15VAEConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.encoder = Encoder(config, rngs=rngs)
        self.decoder = Decoder(config, rngs=rngs)

    # ---------------------------------------------------------------- checks

    def _tiling(self, tiling: Tiling | None) -> Tiling:
        tiling = self.config.tiling if tiling is None else tiling
        if tiling.frames is not None:
            raise ValueError(
                "HunyuanVideo-1.5 streams time in causal chunks; pass a Tiling with frames=None"
            )
        tiling.check(self.config.spatial_factor, self.config.temporal_factor)
        return tiling

    # ---------------------------------------------------------------- traceable pieces

    def moments(
        self,
        x: Float[Array, "b T H W c"],
        *,
        tiling: Tiling | None = None,
        frames_per_step: int = ENCODE_CHUNK,
    ) -> tuple[Float[Array, "b t h w z"], Float[Array, "b t h w z"]]:
        """Unscaled posterior mean and log-variance of a video.

        Args:
          x: pixels in [-1, 1]; T = 1 + 4k frames, H and W multiples of the spatial factor.
          tiling: overrides `config.tiling` (spatial tiles only).
          frames_per_step: frames per scan step after frame 0 (a multiple of 4 dividing
            T - 1); the result does not depend on it, only memory and speed do.

        Returns:
          (mu, logvar), each (b, 1 + (T - 1) / 4, H / s, W / s, z_dim); logvar clipped to
          [-30, 20] as diffusers does.
        """
        self._check_video(x)
        tiling = self._tiling(tiling)
        if (
            frames_per_step < 1
            or frames_per_step % ENCODE_CHUNK
            or (x.shape[1] - 1) % (frames_per_step)
        ):
            raise ValueError(
                f"frames_per_step={frames_per_step} must be a multiple of {ENCODE_CHUNK} "
                f"dividing {x.shape[1] - 1}"
            )

        def whole(v):
            return self.encoder.head(run_chunked(self.encoder.stream, v, frames_per_step))

        x = shard(x.astype(jnp.dtype(self.config.dtype)), VIDEO_AXES)
        if tiling.size is not None and max(x.shape[2:4]) > tiling.size:
            s = self.config.spatial_factor
            h = tiled_2d(whole, x, tile=tiling.size, stride=tiling.stride, scale=1 / s)
        else:
            h = whole(x)
        mu, logvar = jnp.split(h, 2, axis=-1)
        return mu, jnp.clip(logvar, -30.0, 20.0)

    def decode_raw(
        self,
        z: Float[Array, "b t h w z"],
        *,
        tiling: Tiling | None = None,
        latents_per_step: int = 1,
    ) -> Float[Array, "b T H W c"]:
        """Unscaled latents -> pixels, unclamped.

        Args:
          z: raw latents (diffusers' `vae.decode` input).
          tiling: overrides `config.tiling` (spatial tiles only).
          latents_per_step: latent frames per scan step after frame 0 (must divide t - 1);
            the result does not depend on it, only memory and speed do.

        Returns:
          (b, 1 + 4 (t - 1), h * s, w * s, out_channels).
        """
        self._check_latents(z)
        tiling = self._tiling(tiling)
        if latents_per_step < 1 or (z.shape[1] - 1) % latents_per_step:
            raise ValueError(
                f"latents_per_step={latents_per_step} must be positive and divide {z.shape[1] - 1}"
            )

        def whole(v):
            return run_chunked(self.decoder.stream, self.decoder.stem(v), latents_per_step)

        z = shard(z.astype(jnp.dtype(self.config.dtype)), VIDEO_AXES)
        s = self.config.spatial_factor
        if tiling.size is not None and max(z.shape[2:4]) > tiling.size // s:
            return tiled_2d(whole, z, tile=tiling.size // s, stride=tiling.stride // s, scale=s)
        return whole(z)

    # ---------------------------------------------------------------- user API

    def encode(
        self,
        x: Float[Array, "b T H W c"],
        *,
        tiling: Tiling | None = None,
        frames_per_step: int = ENCODE_CHUNK,
    ) -> Float[Array, "b t h w z"]:
        """Scaled posterior mode mu * scaling_factor of a video in [-1, 1].

        Args:
          x: (b, T, H, W, in_channels), T = 1 + 4k, H and W multiples of the spatial factor.
          tiling / frames_per_step: see `moments`.

        Returns:
          (b, 1 + (T - 1) / 4, H / s, W / s, z_dim), what the diffusion transformer sees.
        """
        self._check_video(x)
        return _encode_jit(self, x, self._tiling(tiling), frames_per_step)

    def decode(
        self,
        z: Float[Array, "b t h w z"],
        *,
        tiling: Tiling | None = None,
        latents_per_step: int = 1,
    ) -> Float[Array, "b T H W c"]:
        """Scaled latents -> pixels clamped to [-1, 1], one latent frame per scan step.

        Args:
          z: (b, t, h, w, z_dim) latents as `encode` returns them (scaled).
          tiling / latents_per_step: see `decode_raw`.

        Returns:
          (b, 1 + 4 (t - 1), h * s, w * s, out_channels).
        """
        self._check_latents(z)
        return _decode_jit(self, z, self._tiling(tiling), latents_per_step)


@nnx.jit(static_argnames=("tiling", "frames_per_step"))
def _encode_jit(vae: HunyuanVideo15VAE, x, tiling, frames_per_step):
    mu, _ = vae.moments(x, tiling=tiling, frames_per_step=frames_per_step)
    return mu * jnp.asarray(vae.config.scaling_factor, mu.dtype)


@nnx.jit(static_argnames=("tiling", "latents_per_step"))
def _decode_jit(vae: HunyuanVideo15VAE, z, tiling, latents_per_step):
    z = z.astype(jnp.dtype(vae.config.dtype))
    z = z / jnp.asarray(vae.config.scaling_factor, z.dtype)
    x = vae.decode_raw(z, tiling=tiling, latents_per_step=latents_per_step)
    return jnp.clip(x, -1.0, 1.0)
