"""Shared helpers for the VAE model tests (Wan, HunyuanVideo, HunyuanVideo-1.5)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def video(shape, seed=0):
    """Uniform [-1, 1) float32 pixels of `shape` (b, t, h, w, c)."""
    return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, shape), jnp.float32)


def latents(shape, seed=1):
    """Standard normal float32 latents of `shape` (b, t, h, w, c)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def flat_params(module):
    """{dotted path: parameter} of every `nnx.Param` in `module`."""
    return {
        ".".join(str(getattr(k, "key", k)) for k in path): v
        for path, v in jax.tree_util.tree_flatten_with_path(
            nnx.state(module, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
        )[0]
    }


def assert_decoder_traced_once_per_chunk(vae, monkeypatch, cls, method, latent_shape):
    """`cls.method` (the decoder's chunk body) is traced twice whatever the number of frames:
    frame 0 alone and the scan step.

    Args:
      latent_shape: (h, w, c) of the latents to decode.
    """
    calls = []
    original = getattr(cls, method)

    def counting(self, x, cache):
        calls.append(x.shape[1])
        return original(self, x, cache)

    monkeypatch.setattr(cls, method, counting)
    graphdef, state = nnx.split(vae)
    for t in (3, 9):
        calls.clear()
        jax.make_jaxpr(lambda s, z: nnx.merge(graphdef, s).decode_raw(z))(
            state, jnp.zeros((1, t, *latent_shape))
        )
        assert calls == [1, 1], (t, calls)
