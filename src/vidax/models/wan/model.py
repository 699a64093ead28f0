"""The Wan 2.1 / 2.2 diffusion transformer in Flax NNX (text- and image-to-video).

The forward pass is split into reusable stages so that samplers with unusual control flow
(DVG's reduced grids, Sparse Forcing's chunked KV cache) compose them instead of copying:

    tokens, grid = model.embed(x)                       # patchify
    cond = model.condition(timestep, context)           # temb, per-block modulation, text
    tokens = model.run_blocks(tokens, cond, angles)     # scanned blocks
    x = model.unembed(tokens, cond, grid)               # modulated head + unpatchify

`model(x, timestep, context)` chains them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.dit_stages import MLPEmbedder, VideoDiT
from vidax.models.wan.config import WanConfig
from vidax.nn import LayerNorm, Linear, RMSNorm, apply_rope, attention
from vidax.nn.embeddings import timestep_embedding
from vidax.nn.layers import FeedForward, gelu_tanh, layer_norm, modulate, param
from vidax.nn.scan import scan_layers, stack_layers
from vidax.sharding import shard

# (q, k, v) each (b, l, n, k) -> (b, l, n, k). Replaces plain self-attention, e.g. with a mask.
SelfAttentionFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
# (q, k, v) -> ((b, l, n, k), aux): a self-attention that also returns values of its own (a KV
# cache attention: the keys, values and attention mass it saw), which the block hands back.
AuxAttentionFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


@dataclasses.dataclass(frozen=True)
class Conditioning:
    """Per-call conditioning shared by all blocks.

    temb: (b, 1|l, d) timestep embedding (head modulation); mod: (b, 1|l, 6, d) block modulation;
    context: (b, s, d) projected text tokens; image: (b, s_img, d) embedded image tokens (image-
    to-video models) or None. The `1|l` axis broadcasts over tokens unless the caller passed
    per-token timesteps.
    """

    temb: jax.Array
    mod: jax.Array
    context: jax.Array
    image: jax.Array | None = None


jax.tree_util.register_dataclass(
    Conditioning, data_fields=["temb", "mod", "context", "image"], meta_fields=[]
)


class WanAttention(nnx.Module):
    """Multi-head attention with RMSNorm over the full width on q and k (Wan's qk-norm).

    With `added_kv` (image-to-video cross-attention), image tokens get key/value projections
    and a key norm of their own (`image_kv`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        eps: float,
        added_kv: bool = False,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.to_q = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.to_k = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.to_v = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.to_out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        self.norm_q = RMSNorm(dim, eps=eps, axes=("heads",), param_dtype=param_dtype)
        self.norm_k = RMSNorm(dim, eps=eps, axes=("heads",), param_dtype=param_dtype)
        self.add_k_proj = Linear(dim, dim, axes=("embed", "heads"), **kw) if added_kv else None
        self.add_v_proj = Linear(dim, dim, axes=("embed", "heads"), **kw) if added_kv else None
        self.norm_added_k = (
            RMSNorm(dim, eps=eps, axes=("heads",), param_dtype=param_dtype) if added_kv else None
        )
        self.num_heads = num_heads

    def image_kv(self, image: Float[Array, "b s d"]) -> tuple[jax.Array, jax.Array]:
        """Keys and values (b, s, n, k) of embedded image tokens (no RoPE, like text)."""
        if self.add_k_proj is None or self.add_v_proj is None or self.norm_added_k is None:
            raise ValueError("this attention has no image key/value projections (added_kv)")
        split = lambda y: rearrange(y, "b l (n k) -> b l n k", n=self.num_heads)
        k = split(self.norm_added_k(self.add_k_proj(image)))
        v = split(self.add_v_proj(image))
        axes = ("batch", "image_tokens", "attn_heads", "head_dim")
        return shard(k, axes), shard(v, axes)

    def qkv(
        self, x: Float[Array, "b l d"], context: Float[Array, "b s d"] | None = None, angles=None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Projected, normalised (and, for self-attention, rotated) q (b,l,n,k), k and v (b,s,n,k)."""
        source = x if context is None else context
        split = lambda y: rearrange(y, "b l (n k) -> b l n k", n=self.num_heads)
        q = split(self.norm_q(self.to_q(x)))
        k = split(self.norm_k(self.to_k(source)))
        v = split(self.to_v(source))
        if angles is not None:
            q, k = apply_rope(q, angles), apply_rope(k, angles)
        q = shard(q, ("batch", "attn_tokens", "attn_heads", "head_dim"))
        kv_axes = (
            "batch",
            "kv_tokens" if context is None else "text_tokens",
            "attn_heads",
            "head_dim",
        )
        return q, shard(k, kv_axes), shard(v, kv_axes)

    def out(self, o: Float[Array, "b l n k"]) -> Float[Array, "b l d"]:
        # Pin the layout on both sides of the head merge: under Ulysses this is where heads go
        # back to tokens (an all-to-all) before the output projection.
        o = shard(o, ("batch", "attn_tokens", "attn_heads", "head_dim"))
        merged = shard(rearrange(o, "b l n k -> b l (n k)"), ("batch", "tokens", "attn_heads"))
        return self.to_out(merged)


class WanBlock(nnx.Module):
    """Self-attention (RoPE, adaLN) -> cross-attention to text -> FFN (adaLN), gated residuals."""

    def __init__(self, config: WanConfig, *, rngs: nnx.Rngs):
        c = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        self.attn1 = WanAttention(c.dim, c.num_heads, eps=c.eps, **kw)
        self.attn2 = WanAttention(
            c.dim, c.num_heads, eps=c.eps, added_kv=c.image_dim is not None, **kw
        )
        self.norm2 = (
            LayerNorm(c.dim, eps=c.eps, param_dtype=c.storage_dtype) if c.cross_attn_norm else None
        )
        self.ffn = FeedForward(c.dim, c.ffn_dim, **kw)
        table = jax.random.normal(rngs.params(), (6, c.dim), jnp.float32) / c.dim**0.5
        self.scale_shift_table = param(table.astype(c.storage_dtype), (None, "embed"))
        self.eps = c.eps
        self.attention_impl = c.attention_impl

    def __call__(
        self,
        x: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        self_attention: SelfAttentionFn | None = None,
    ) -> Float[Array, "b l d"]:
        """The block; `self_attention` replaces the self-attention core (default `attention`)."""
        attend = self_attention or (lambda q, k, v: attention(q, k, v, impl=self.attention_impl))
        x, _ = self.call_with_aux(x, cond, angles, lambda q, k, v: (attend(q, k, v), None))
        return x

    def call_with_aux(
        self,
        x: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        self_attention: AuxAttentionFn,
    ) -> tuple[Float[Array, "b l d"], Any]:
        """The block with a self-attention core that returns `(o, aux)`; returns `(x, aux)`.

        `aux` is whatever the core returned beside its output, e.g. the keys and values a KV
        cache attention saw, which its caller writes into the cache.
        """
        table = self.scale_shift_table[...].astype(jnp.float32)[None, None]  # (1, 1, 6, d)
        m = table + cond.mod  # (b, 1|l, 6, d)
        shift, scale, gate, c_shift, c_scale, c_gate = (m[:, :, i] for i in range(6))
        dtype = x.dtype

        h = modulate(layer_norm(x, self.eps), shift, scale).astype(dtype)
        q, k, v = self.attn1.qkv(h, angles=angles)
        o, aux = self_attention(q, k, v)
        attn = self.attn1.out(o).astype(jnp.float32)
        x = (x.astype(jnp.float32) + attn * gate).astype(dtype)

        h = x if self.norm2 is None else self.norm2(x)
        q, k, v = self.attn2.qkv(h, cond.context)
        o = attention(q, k, v, impl=self.attention_impl)
        if cond.image is not None:  # image-to-video: attend to the image tokens separately
            k_img, v_img = self.attn2.image_kv(cond.image)
            o = o + attention(q, k_img, v_img, impl=self.attention_impl)
        x = x + self.attn2.out(o).astype(dtype)

        h = modulate(layer_norm(x, self.eps), c_shift, c_scale).astype(dtype)
        x = (x.astype(jnp.float32) + self.ffn(h).astype(jnp.float32) * c_gate).astype(dtype)
        return shard(x, ("batch", "tokens", "embed")), aux


class WanImageEmbedder(nnx.Module):
    """CLIP image tokens -> model width: LayerNorm -> Linear -> GELU -> Linear -> LayerNorm
    (diffusers `WanImageEmbedding`; the norms in float32 with eps 1e-5), plus a learned position
    embedding over two images' tokens for first-last-frame models."""

    def __init__(self, config: WanConfig, *, rngs: nnx.Rngs):
        c = config
        assert c.image_dim is not None
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        self.norm1 = LayerNorm(c.image_dim, eps=1e-5, param_dtype=c.storage_dtype)
        self.proj_in = Linear(c.image_dim, c.image_dim, axes=("image_embed", "mlp"), **kw)
        self.proj_out = Linear(c.image_dim, c.dim, axes=("mlp", "embed"), **kw)
        self.norm2 = LayerNorm(c.dim, eps=1e-5, param_dtype=c.storage_dtype)
        self.pos_embed = (
            None
            if c.pos_embed_seq_len is None
            else param(
                jnp.zeros((c.pos_embed_seq_len, c.image_dim), c.storage_dtype),
                (None, "image_embed"),
            )
        )

    def __call__(self, image: Float[Array, "b s e"]) -> Float[Array, "b s d"]:
        if self.pos_embed is not None:  # two images' tokens share one sequence
            b, s, e = image.shape
            if b % 2 or 2 * s != self.pos_embed.shape[0]:
                raise ValueError(
                    "a first-last-frame model reads two images per video (consecutive rows, "
                    f"{self.pos_embed.shape[0] // 2} tokens each), got image {image.shape}"
                )
            image = image.reshape(-1, 2 * s, e) + self.pos_embed[...].astype(image.dtype)[None]
        h = self.norm1(image)
        h = self.proj_out(jax.nn.gelu(self.proj_in(h), approximate=False))
        return self.norm2(h)


class WanTransformer(VideoDiT):
    """Wan 2.1 / 2.2 DiT: `(x, timestep, context, image=None, condition=None) -> flow v`.

    Inputs are channels-last latents. Image-to-video models also read CLIP image tokens
    (`image`, Wan 2.1 I2V) and/or condition channels concatenated to the latent (`condition`:
    first-frame mask and image latents, see `VideoDiT.__call__`). Blocks are created stacked
    (leading "layers" axis) and run with `jax.lax.scan`, so compile time does not grow with
    depth.
    """

    PATCH_EMBEDDING = "patch_embedding"

    def __init__(self, config: WanConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        self.patch_embedding = Linear(c.patch_features, c.dim, axes=("patch", "embed"), **kw)
        f32 = {**kw, "dtype": jnp.float32}
        self.time_embedder = MLPEmbedder(c.freq_dim, c.dim, in_axis="freq", **f32)
        self.time_proj = Linear(c.dim, 6 * c.dim, axes=("embed", "modulation"), **f32)
        self.text_embedder = MLPEmbedder(
            c.text_dim, c.dim, in_axis="text_embed", activation=gelu_tanh, **kw
        )
        self.image_embedder = None if c.image_dim is None else WanImageEmbedder(c, rngs=rngs)

        self.blocks = stack_layers(c.num_layers, lambda rngs: WanBlock(c, rngs=rngs), rngs)
        self.proj_out = Linear(
            c.dim, c.patch_features // c.in_channels * c.out_channels, axes=("embed", "patch"), **kw
        )
        table = jax.random.normal(rngs.params(), (2, c.dim), jnp.float32) / c.dim**0.5
        self.scale_shift_table = param(table.astype(c.storage_dtype), (None, "embed"))

    def __call__(
        self,
        x: Float[Array, "b t h w c"],
        *args: Any,
        positions: Float[Array, "l 3"] | None = None,
        condition: Float[Array, "b t h w k"] | None = None,
        **kwargs: Any,
    ) -> Float[Array, "b t h w c"]:
        """`VideoDiT.__call__` (args: timestep, context); with `config.expand_timesteps` (Wan
        2.2 TI2V) a `condition` (b, t, h, w, c + 1) of image latents and a mask channel (1
        where a frame is given) replaces those frames of `x`, whose tokens then see timestep 0
        (diffusers' `expand_timesteps`); the other tokens keep the timestep."""
        if self.config.expand_timesteps and condition is not None:
            timestep, *rest = args
            x, timestep = replace_frames(self.config, x, timestep, condition)
            args, condition = (timestep, *rest), None
        return super().__call__(x, *args, positions=positions, condition=condition, **kwargs)

    # -- stages ---------------------------------------------------------------------------------

    def condition(
        self,
        timestep: Float[Array, " b"] | Float[Array, "b l"],
        context: Float[Array, "b s e"],
        image: Float[Array, "b s_img e_img"] | None = None,
    ) -> Conditioning:
        """Timestep embedding, block modulation, projected text and image tokens for one
        forward pass.

        `timestep` is (b,) in [0, 1000] or per token (b, l) (e.g. per-frame noise levels);
        `image` (b, s_img, image_dim) CLIP tokens (`config.image_dim`: required, else refused).
        """
        c = self.config
        if context.ndim != 3 or context.shape[-1] != c.text_dim:
            raise ValueError(f"context must be (b, s, {c.text_dim}), got {context.shape}")
        if (image is None) != (self.image_embedder is None):
            raise ValueError(
                f"this Wan model reads CLIP image tokens: pass image=(b, s, {c.image_dim})"
                if image is None
                else "this Wan model has no image embedder (image_dim is None): image= is not "
                "used by it"
            )
        t = timestep if timestep.ndim == 2 else timestep[:, None]
        temb = self.time_embedder(timestep_embedding(t, c.freq_dim))  # (b, 1|l, d) f32
        mod = self.time_proj(jax.nn.silu(temb)).reshape(*temb.shape[:2], 6, c.dim)
        text = self.text_embedder(context.astype(c.compute_dtype))
        tokens = None
        if self.image_embedder is not None and image is not None:
            if image.ndim != 3 or image.shape[-1] != c.image_dim:
                raise ValueError(f"image must be (b, s, {c.image_dim}), got {image.shape}")
            tokens = self.image_embedder(image.astype(c.compute_dtype))
            tokens = shard(tokens.astype(c.compute_dtype), ("batch", "image_tokens", "embed"))
        return Conditioning(
            temb=temb,
            mod=mod,
            context=shard(text, ("batch", "text_tokens", "embed")),
            image=tokens,
        )

    def run_blocks(
        self,
        tokens: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        self_attention: SelfAttentionFn | None = None,
    ) -> Float[Array, "b l d"]:
        """All blocks under one `lax.scan` over the stacked parameters."""
        return scan_layers(
            self.blocks,
            tokens,
            lambda block, x: block(x, cond, angles, self_attention=self_attention),
            remat=self.config.remat,
        )

    def unembed(
        self, tokens: Float[Array, "b l d"], cond: Conditioning, grid: tuple[int, int, int]
    ) -> Float[Array, "b t h w c"]:
        """Modulated output head and unpatchify back to a channels-last latent (float32)."""
        return self._head(tokens, _head_modulation(self.scale_shift_table, cond.temb), grid)


def replace_frames(
    config: WanConfig,
    x: Float[Array, "b t h w c"],
    timestep: Float[Array, " b"] | Float[Array, "b l"],
    condition: Float[Array, "b t h w c+1"],
) -> tuple[Float[Array, "b t h w c"], Float[Array, "b l"]]:
    """x with the condition's given frames written in, and per-token timesteps that are 0 on
    them (`WanConfig.expand_timesteps`). A token's mask is its patch's first latent sample
    (diffusers reads `mask[:, ::2, ::2]`)."""
    c = config.out_channels
    if condition.shape != (*x.shape[:-1], c + 1):
        raise ValueError(
            f"condition must be {(*x.shape[:-1], c + 1)} (image latents + mask), got "
            f"{condition.shape}"
        )
    mask = condition[..., c:].astype(jnp.float32)  # 1 where the frame is given
    x = (mask * condition[..., :c] + (1.0 - mask) * x).astype(x.dtype)
    pt, ph, pw = config.patch_size
    noisy = 1.0 - mask[:, ::pt, ::ph, ::pw, 0].reshape(x.shape[0], -1)  # (b, l)
    t = timestep.astype(jnp.float32)
    return x, (t[:, None] if t.ndim == 1 else t) * noisy


def _head_modulation(table: nnx.Param, temb: jax.Array) -> tuple[jax.Array, jax.Array]:
    """shift, scale (b, 1|l, d) of the output head: learned table + timestep embedding."""
    m = table[...].astype(jnp.float32)[None, None] + temb[:, :, None, :]  # (b, 1|l, 2, d)
    return m[:, :, 0], m[:, :, 1]
