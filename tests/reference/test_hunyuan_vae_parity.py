"""HunyuanVideoVAE vs diffusers `AutoencoderKLHunyuanVideo`: random tiny models through the real
checkpoint path, whole clips and diffusers' temporal and spatial tiling."""

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
from vidax.models.hunyuan_vae import (  # noqa: E402
    NO_TILING,
    PRESETS,
    HunyuanVideoVAE,
    Tiling,
    from_diffusers_config,
    key_map,
    load,
    save,
)

pytestmark = pytest.mark.reference

RTOL = 1e-4  # max |err| / max |reference|, float32

# Four stages like the release (8x spatial, 4x temporal), all widths tiny, a non-default scale.
TINY_DIFFUSERS = {
    "latent_channels": 4,
    "block_out_channels": [8, 8, 16, 16],
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "scaling_factor": 0.7,
}
# Small tiles so tiny inputs exercise diffusers' tiling: 16 px tiles every 8 px, 8-frame tiles
# every 4 frames.
SMALL_TILES = {
    "tile_sample_min_height": 16,
    "tile_sample_min_width": 16,
    "tile_sample_stride_height": 8,
    "tile_sample_stride_width": 8,
    "tile_sample_min_num_frames": 8,
    "tile_sample_stride_num_frames": 4,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("hunyuan_vae_tiny")
    return saved_pair(
        diffusers.AutoencoderKLHunyuanVideo, TINY_DIFFUSERS, path, load, from_diffusers_config
    )


@nnx.jit(static_argnames="tiling")
def _decode_raw(vae, z, tiling):
    return vae.decode_raw(z, tiling=tiling)


@nnx.jit(static_argnames="tiling")
def _mu(vae, x, tiling):
    return vae.moments(x, tiling=tiling)[0]


def _video(shape):
    return np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)


def _latents(shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def test_config_round_trips_through_diffusers(tiny):
    ref, vae = tiny
    assert vae.config.block_out_channels == (8, 8, 16, 16)
    assert vae.config.scaling_factor == ref.config.scaling_factor == 0.7
    assert vae.config.spatial_factor == ref.config.spatial_compression_ratio


def test_whole_clip_encode_and_decode_match_diffusers(tiny):
    ref, vae = tiny
    ref.use_framewise_encoding = ref.use_framewise_decoding = False
    try:
        x = _video((2, 9, 16, 24, 3))
        mu = ref_encode(ref, x)
        # `encode` returns the posterior mode scaled as the pipelines scale it.
        assert_close(vae.encode(jnp.asarray(x), tiling=NO_TILING), mu * 0.7, RTOL, "encode")
        z = _latents((2, 3, 2, 3, 4))
        want = ref_decode(ref, z / 0.7)
        assert np.abs(want).max() > 1  # the clamp below is exercised
        got = vae.decode(jnp.asarray(z), tiling=NO_TILING)
        assert_close(got, np.clip(want, -1, 1), RTOL, "decode")
    finally:
        ref.use_framewise_encoding = ref.use_framewise_decoding = True


def test_default_framewise_decode_matches_diffusers(tiny):
    """diffusers decodes > 4 latent frames in 5-frame tiles every 3, blended over 4 frames."""
    ref, vae = tiny
    z = _latents((1, 7, 2, 2, 4))  # tiles at latents 0 and 3 (5 frames), 6 (1 frame: dropped)
    want = ref_decode(ref, z)
    got = _decode_raw(vae, jnp.asarray(z), Tiling(size=None))
    assert_close(got, want, RTOL, "framewise decode")
    # Tiling changed the result, so the comparison saw the tiled path.
    untiled = _ref_decode_untiled(ref, z)
    assert np.abs(untiled - want).max() > 1e-3


def _ref_decode_untiled(ref, z):
    ref.use_framewise_decoding = False
    try:
        return ref_decode(ref, z)
    finally:
        ref.use_framewise_decoding = True


@pytest.mark.slow
def test_framewise_encode_matches_diffusers(tiny):
    ref, vae = tiny
    x = _video((1, 25, 8, 8, 3))  # 17-frame tiles at frames 0 and 12; 24 is a lone frame
    got = _mu(vae, jnp.asarray(x), Tiling(size=None))
    assert_close(got, ref_encode(ref, x), RTOL, "framewise encode")


@pytest.mark.slow
def test_small_tiles_match_diffusers(tiny):
    """Spatial tiles inside temporal tiles, with partial tiles at every edge."""
    ref, vae = tiny
    tiling = Tiling(size=16, stride=8, frames=8, frames_stride=4)
    ref.enable_tiling(**SMALL_TILES)
    try:
        z = _latents((1, 5, 3, 3, 4))
        assert_close(_decode_raw(vae, jnp.asarray(z), tiling), ref_decode(ref, z), RTOL, "decode")
        x = _video((1, 17, 24, 24, 3))
        got = _mu(vae, jnp.asarray(x), tiling)
        assert_close(got, ref_encode(ref, x), RTOL, "encode")
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
    fresh = diffusers.AutoencoderKLHunyuanVideo(**TINY_DIFFUSERS)
    fresh.load_state_dict(saved, strict=True)


@pytest.mark.parametrize("attend", [True, False])
def test_key_map_covers_the_released_checkpoint(attend):
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLHunyuanVideo(mid_block_add_attention=attend)
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    config = from_diffusers_config(dict(ref.config))
    assert config == PRESETS["hunyuanvideo"] or not attend
    abstract = nnx.eval_shape(lambda: HunyuanVideoVAE(config, rngs=nnx.Rngs(0)))
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
