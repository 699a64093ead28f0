"""Numerical parity of the Wan DiT against diffusers' WanTransformer3DModel (tiny, random)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from vidax.checkpoint import save_model  # noqa: E402
from vidax.models.wan import WanConfig, key_map, load, to_diffusers_config  # noqa: E402
from vidax.nn import rope_angles, timestep_embedding, video_positions  # noqa: E402

pytestmark = pytest.mark.reference

CONFIG = WanConfig(
    dim=64,
    num_layers=3,
    num_heads=4,
    ffn_dim=96,
    in_channels=8,
    out_channels=8,
    text_dim=24,
    text_len=7,
    freq_dim=32,
    dtype="float32",
    param_dtype="float32",
)


def _reference_model(config: WanConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = diffusers.WanTransformer3DModel(**to_diffusers_config(config)).eval()
    # diffusers zero-initialises some biases; randomise everything so every weight is tested.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    ref = _reference_model(CONFIG)
    path = tmp_path_factory.mktemp("wan")
    ref.save_pretrained(path, safe_serialization=True)
    return ref, load(path, CONFIG)


def _inputs(seed, b=2, t=3, h=6, w=8, per_token=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, t, h, w, CONFIG.in_channels)).astype(np.float32)
    ctx = rng.standard_normal((b, CONFIG.text_len, CONFIG.text_dim)).astype(np.float32)
    if per_token:
        tokens = t * (h // 2) * (w // 2)
        ts = rng.uniform(0, 1000, (b, tokens)).astype(np.float32)
    else:
        ts = np.array([999.0, 37.5][:b], np.float32)
    return x, ts, ctx


@pytest.mark.parametrize("per_token", [False, True])
def test_transformer_matches_diffusers(models, per_token):
    ref, model = models
    x, ts, ctx = _inputs(0, per_token=per_token)
    with torch.no_grad():
        want = ref(
            torch.from_numpy(x).permute(0, 4, 1, 2, 3),
            torch.from_numpy(ts),
            torch.from_numpy(ctx),
            return_dict=False,
        )[0]
    got = jax.jit(lambda x, t, c: model(x, t, c))(x, ts, ctx)
    assert got.dtype == jnp.float32
    assert_close(got, to_numpy(want.permute(0, 2, 3, 4, 1)), 1e-4, "wan output")


def test_timestep_embedding_matches_diffusers():
    from diffusers.models.embeddings import Timesteps

    t = np.array([0.0, 1.5, 250.0, 999.0], np.float32)
    want = Timesteps(CONFIG.freq_dim, flip_sin_to_cos=True, downscale_freq_shift=0)(
        torch.from_numpy(t)
    )
    got = timestep_embedding(jnp.asarray(t), CONFIG.freq_dim)
    # Angles reach ~1000 rad, where one float32 ulp is 6e-5 rad: both sides round differently.
    assert_close(got, to_numpy(want), 1e-5, "timestep embedding")


def test_rope_matches_diffusers():
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    head_dim, grid = 128, (3, 5, 4)
    rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=64)
    cos, sin = rope(torch.zeros(1, 16, grid[0], 2 * grid[1], 2 * grid[2]))
    cfg = dataclasses.replace(CONFIG, dim=head_dim * 2, num_heads=2)
    angles = rope_angles(video_positions(*grid), cfg.rope_axes_dims)
    # diffusers repeats each angle for the interleaved pair: cos[..., 2j] == cos[..., 2j+1].
    assert_close(jnp.cos(angles), to_numpy(cos)[0, :, 0, 0::2], 1e-6, "rope cos")
    assert_close(jnp.sin(angles), to_numpy(sin)[0, :, 0, 1::2], 1e-6, "rope sin")


def test_export_round_trips_to_diffusers(models, tmp_path):
    """Loading then exporting reproduces the diffusers state dict bit for bit."""

    ref, model = models
    save_model(model, tmp_path / "diffusion_pytorch_model.safetensors", key_map(CONFIG))
    import safetensors.torch

    exported = safetensors.torch.load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    original = ref.state_dict()
    assert set(exported) == set(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key].numpy(), value.numpy(), err_msg=key)


# Wan 2.1 image-to-video: 4 mask + 4 image-latent condition channels beside the latent, CLIP
# tokens through the cross-attention's added key/value projections. diffusers splits the
# cross-attention context as [image; text] assuming exactly 512 text tokens, hence text_len.
I2V = dataclasses.replace(
    CONFIG, in_channels=16, text_len=512, image_dim=20, added_kv_proj_dim=CONFIG.dim
)
# First-last-frame models add a position embedding over two images' tokens.
FLF2V = dataclasses.replace(I2V, pos_embed_seq_len=2 * 5)


@pytest.mark.parametrize("config", [I2V, FLF2V], ids=["i2v", "flf2v"])
def test_image_to_video_transformer_matches_diffusers(config, tmp_path):
    ref = _reference_model(config, seed=1)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = load(tmp_path, config)
    rng = np.random.default_rng(3)
    b, t, h, w = 2, 3, 4, 6
    x = rng.standard_normal((b, t, h, w, config.out_channels)).astype(np.float32)
    condition = rng.standard_normal((b, t, h, w, config.condition_channels)).astype(np.float32)
    ctx = rng.standard_normal((b, config.text_len, config.text_dim)).astype(np.float32)
    images = b if config.pos_embed_seq_len is None else 2 * b  # first + last frame
    image = rng.standard_normal((images, 5, config.image_dim)).astype(np.float32)
    ts = np.array([999.0, 37.5], np.float32)
    with torch.no_grad():
        want = ref(
            torch.from_numpy(np.concatenate([x, condition], -1)).permute(0, 4, 1, 2, 3),
            torch.from_numpy(ts),
            torch.from_numpy(ctx),
            encoder_hidden_states_image=torch.from_numpy(image),
            return_dict=False,
        )[0]
    got = jax.jit(lambda x, t, c, i, k: model(x, t, c, image=i, condition=k))(
        x, ts, ctx, image, condition
    )
    assert_close(got, to_numpy(want.permute(0, 2, 3, 4, 1)), 1e-4, "wan i2v output")
    # The image tokens matter (a model ignoring them would pass the rest).
    other = model(x, ts, ctx, image=image[::-1].copy(), condition=condition)
    assert np.abs(np.asarray(other - got)).max() > 1e-3
    # And the export writes diffusers' keys back, bit for bit.
    save_model(model, tmp_path / "export.safetensors", key_map(config))
    import safetensors.torch

    exported = safetensors.torch.load_file(tmp_path / "export.safetensors")
    assert set(exported) == set(ref.state_dict())
