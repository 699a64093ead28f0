"""HunyuanVideo15VAE vs diffusers `AutoencoderKLHunyuanVideo15`: random tiny models through the
real checkpoint path; our chunked streaming against diffusers' whole-clip passes and its tiling.

diffusers' 1.5 attention mask only broadcasts for batch 1, so the references run one video.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tests.reference._torch import assert_close  # noqa: E402
from tests.reference._vae import (  # noqa: E402
    ref_decode,
    ref_encode,
    saved_pair,
)
from vidax.models.hunyuan15_vae import (  # noqa: E402
    NO_TILING,
    PRESETS,
    HunyuanVideo15VAE,
    Tiling,
    from_diffusers_config,
    key_map,
    load,
    save,
)

pytestmark = pytest.mark.reference

RTOL = 1e-4  # max |err| / max |reference|, float32

# Five stages like the release (16x spatial, 4x temporal), tiny widths, a non-default scale.
TINY_DIFFUSERS = {
    "latent_channels": 4,
    "block_out_channels": [8, 16, 16, 32, 32],
    "layers_per_block": 1,
    "scaling_factor": 0.7,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("hunyuan15_vae_tiny")
    return saved_pair(
        diffusers.AutoencoderKLHunyuanVideo15, TINY_DIFFUSERS, path, load, from_diffusers_config
    )


def _video(shape):
    return np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)


def _latents(shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


@nnx.jit(static_argnames="tiling")
def _mu(vae, x, tiling):
    return vae.moments(x, tiling=tiling)[0]


@nnx.jit(static_argnames="tiling")
def _decode_raw(vae, z, tiling):
    return vae.decode_raw(z, tiling=tiling)


def test_config_round_trips_through_diffusers(tiny):
    ref, vae = tiny
    assert vae.config.block_out_channels == (8, 16, 16, 32, 32)
    assert vae.config.scaling_factor == ref.config.scaling_factor == 0.7
    assert vae.config.spatial_factor == ref.config.spatial_compression_ratio == 16


def test_streamed_encode_matches_whole_clip_diffusers(tiny):
    ref, vae = tiny
    x = _video((1, 9, 32, 48, 3))  # frame 0, then two 4-frame chunks through the caches
    mu = ref_encode(ref, x)
    # `encode` returns the posterior mode scaled as the pipelines scale it.
    assert_close(vae.encode(jnp.asarray(x), tiling=NO_TILING), mu * 0.7, RTOL, "encode")


def test_streamed_decode_matches_whole_clip_diffusers(tiny):
    ref, vae = tiny
    z = _latents((1, 3, 2, 3, 4))  # latent frame 0, then two scan steps
    want = ref_decode(ref, z / 0.7)
    assert np.abs(want).max() > 1  # the clamp below is exercised
    got = vae.decode(jnp.asarray(z), tiling=NO_TILING)
    assert_close(got, np.clip(want, -1, 1), RTOL, "decode")


@pytest.mark.slow
def test_spatial_tiles_match_diffusers(tiny):
    """32 px tiles every 16 px (2 latents every 1), blended over 16 px / 1 latent."""
    ref, vae = tiny
    tiling = Tiling(size=32, stride=16, frames=None)
    ref.enable_tiling(
        tile_sample_min_height=32,
        tile_sample_min_width=32,
        tile_latent_min_height=2,
        tile_latent_min_width=2,
        tile_overlap_factor=0.5,
    )
    try:
        z = _latents((1, 3, 3, 4, 4))
        assert_close(_decode_raw(vae, jnp.asarray(z), tiling), ref_decode(ref, z), RTOL, "decode")
        x = _video((1, 5, 48, 64, 3))
        assert_close(_mu(vae, jnp.asarray(x), tiling), ref_encode(ref, x), RTOL, "encode")
    finally:
        ref.disable_tiling()


def test_saved_checkpoint_is_the_diffusers_state_dict(tiny, tmp_path):
    ref, vae = tiny
    save(vae, tmp_path / "vae.safetensors")
    saved = safetensors_torch.load_file(tmp_path / "vae.safetensors")
    want = ref.state_dict()
    assert sorted(saved) == sorted(want)
    for key, value in want.items():
        assert saved[key].shape == value.shape, key
        torch.testing.assert_close(saved[key], value, rtol=0, atol=0, msg=key)
    fresh = diffusers.AutoencoderKLHunyuanVideo15(**TINY_DIFFUSERS)
    fresh.load_state_dict(saved, strict=True)


@pytest.mark.parametrize("match", [True, False])
def test_key_map_covers_the_released_checkpoint(match):
    """The release, and unmatched resampler widths (residual shortcuts appear)."""
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLHunyuanVideo15(
            downsample_match_channel=match, upsample_match_channel=match
        )
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert match or any("conv_shortcut" in k for k in shapes)
    config = from_diffusers_config(dict(ref.config))
    assert config == PRESETS["hunyuanvideo15"] or not match
    abstract = nnx.eval_shape(lambda: HunyuanVideo15VAE(config, rngs=nnx.Rngs(0)))
    params = {
        ".".join(str(getattr(k, "key", k)) for k in path): v.get_value()
        for path, v in jax.tree_util.tree_flatten_with_path(
            nnx.state(abstract, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
        )[0]
    }
    rules = key_map(config)
    assert sorted(r.source for r in rules) == sorted(shapes)
    for rule in rules:
        src = jax.ShapeDtypeStruct(shapes[rule.source], jnp.float32)
        got = jax.eval_shape(rule.transform, src) if rule.transform else src
        assert got.shape == params[rule.target].shape, rule
        if rule.inverse is not None:
            assert jax.eval_shape(rule.inverse, got).shape == src.shape, rule
