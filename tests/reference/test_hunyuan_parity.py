"""Numerical parity of the HunyuanVideo DiT against diffusers' HunyuanVideoTransformer3DModel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from vidax.checkpoint import CheckpointError, save_model  # noqa: E402
from vidax.models.hunyuan import (  # noqa: E402
    PRESETS,
    HunyuanVideoConfig,
    HunyuanVideoTransformer,
    key_map,
    load,
)
from vidax.nn import rope_angles, video_positions  # noqa: E402

pytestmark = pytest.mark.reference

# Two blocks of every kind; head_dim 16 split (4, 6, 6) over (t, h, w) RoPE.
CONFIG = HunyuanVideoConfig(
    num_heads=2,
    head_dim=16,
    num_layers=2,
    num_single_layers=2,
    num_refiner_layers=2,
    mlp_ratio=3.0,
    in_channels=4,
    out_channels=6,
    patch_size=(1, 2, 2),
    text_dim=24,
    text_len=7,
    pooled_dim=20,
    rope_axes_dims=(4, 6, 6),
    dtype="float32",
    param_dtype="float32",
)


def _reference_model(config: HunyuanVideoConfig, seed: int = 0):
    torch.manual_seed(seed)
    pt, ph, pw = config.patch_size
    assert ph == pw
    model = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        num_layers=config.num_layers,
        num_single_layers=config.num_single_layers,
        num_refiner_layers=config.num_refiner_layers,
        mlp_ratio=config.mlp_ratio,
        patch_size=ph,
        patch_size_t=pt,
        guidance_embeds=config.guidance_embeds,
        text_embed_dim=config.text_dim,
        pooled_projection_dim=config.pooled_dim,
        rope_theta=config.rope_theta,
        rope_axes_dim=config.rope_axes_dims,
    ).eval()
    # diffusers zero-initialises some biases and gates; randomise everything so every weight
    # is tested.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    ref = _reference_model(CONFIG)
    path = tmp_path_factory.mktemp("hunyuan")
    ref.save_pretrained(path, safe_serialization=True)
    return ref, load(path, CONFIG)


def _inputs(seed, b=2, t=3, h=4, w=6):
    rng = np.random.default_rng(seed)
    c = CONFIG
    x = rng.standard_normal((b, t, h, w, c.in_channels)).astype(np.float32)
    text = rng.standard_normal((b, c.text_len, c.text_dim)).astype(np.float32)
    # Right-padded prompts of different lengths (the pipeline's layout); one is unpadded.
    lengths = np.array([4, c.text_len][:b])
    mask = np.arange(c.text_len)[None] < lengths[:, None]
    pooled = rng.standard_normal((b, c.pooled_dim)).astype(np.float32)
    ts = np.array([999.0, 37.5][:b], np.float32)
    guidance = np.array([6000.0, 3500.0][:b], np.float32)
    return x, ts, text, mask, pooled, guidance


def _reference(ref, x, ts, text, mask, pooled, guidance):
    with torch.no_grad():
        out = ref(
            torch.from_numpy(x).permute(0, 4, 1, 2, 3),
            torch.from_numpy(ts),
            torch.from_numpy(text),
            torch.from_numpy(mask.astype(np.int64)),
            torch.from_numpy(pooled),
            torch.from_numpy(guidance),
            return_dict=False,
        )[0]
    return to_numpy(out.permute(0, 2, 3, 4, 1))


def test_transformer_matches_diffusers(models):
    ref, model = models
    inputs = _inputs(0)
    want = _reference(ref, *inputs)
    got = jax.jit(lambda *a: model(*a))(*inputs)
    assert got.dtype == jnp.float32
    assert_close(got, want, 1e-4, "hunyuanvideo output")


def test_transformer_matches_diffusers_at_another_grid(models):
    """Odd token grid (t'=2, h'=3, w'=1) and batch 1 with a padded prompt."""
    ref, model = models
    x, ts, text, mask, pooled, guidance = _inputs(1, b=1, t=2, h=6, w=2)
    want = _reference(ref, x, ts, text, mask, pooled, guidance)
    got = jax.jit(lambda *a: model(*a))(x, ts, text, mask, pooled, guidance)
    assert_close(got, want, 1e-4, "hunyuanvideo output (small grid)")


def test_rope_matches_diffusers():
    from diffusers.models.transformers.transformer_hunyuan_video import (
        HunyuanVideoRotaryPosEmbed,
    )

    dims, grid = (16, 56, 56), (3, 5, 4)
    cos, sin = HunyuanVideoRotaryPosEmbed(2, 1, list(dims), 256.0)(
        torch.zeros(1, 16, grid[0], 2 * grid[1], 2 * grid[2])
    )
    angles = rope_angles(video_positions(*grid), dims, 256.0)
    # diffusers repeats each angle for the interleaved pair: cos[..., 2j] == cos[..., 2j+1].
    assert_close(jnp.cos(angles), to_numpy(cos)[:, 0::2], 1e-6, "rope cos")
    assert_close(jnp.sin(angles), to_numpy(sin)[:, 1::2], 1e-6, "rope sin")


def test_export_round_trips_to_diffusers(models, tmp_path):
    """Loading then exporting reproduces the diffusers state dict bit for bit."""
    import safetensors.torch

    ref, model = models
    save_model(model, tmp_path / "diffusion_pytorch_model.safetensors", key_map(CONFIG))
    exported = safetensors.torch.load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    original = ref.state_dict()
    assert set(exported) == set(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key].numpy(), value.numpy(), err_msg=key)


def test_misshaped_checkpoint_names_the_key(tmp_path):
    import safetensors.torch

    ref = _reference_model(CONFIG)
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    key = "single_transformer_blocks.1.proj_mlp.weight"
    state[key] = state[key][:-1]
    safetensors.torch.save_file(state, tmp_path / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load(tmp_path, CONFIG)


def assert_preset_matches_diffusers_defaults(reference_cls, model_cls, config, rules) -> None:
    """Every diffusers tensor of `reference_cls()` (its default, released config) maps through
    `rules` onto a vidax parameter of `model_cls(config)` of the same shape, and back."""
    import math

    from flax import nnx

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in reference_cls().state_dict().items()}
    abstract = nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0)))
    leaves = jax.tree_util.tree_flatten_with_path(
        nnx.state(abstract, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
    )[0]
    params = {
        ".".join(str(getattr(k, "key", k)) for k in path): v.get_value().shape for path, v in leaves
    }
    covered = []
    for rule in rules:
        want = params[rule.target]
        keys = [rule.source.format(i=i) for i in range(want[0])] if rule.stacked else [rule.source]
        for key in keys:
            assert key in shapes, f"{key} (for {rule.target}) is not a diffusers tensor"
            src = jax.ShapeDtypeStruct(shapes[key], jnp.float32)
            got = jax.eval_shape(rule.transform, src).shape if rule.transform else src.shape
            assert got == (want[1:] if rule.stacked else want), key
        covered += keys
    assert sorted(covered) == sorted(shapes)
    assert sum(map(math.prod, shapes.values())) == sum(map(math.prod, params.values()))


def test_preset_matches_diffusers_defaults():
    config = PRESETS["hunyuanvideo"]
    assert_preset_matches_diffusers_defaults(
        diffusers.HunyuanVideoTransformer3DModel,
        HunyuanVideoTransformer,
        config,
        key_map(config),
    )
