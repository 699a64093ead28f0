"""Numerical parity of the HunyuanVideo-1.5 DiT against diffusers'
HunyuanVideo15Transformer3DModel (tiny, random)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from tests.reference.test_hunyuan_parity import (  # noqa: E402
    assert_preset_matches_diffusers_defaults,
)
from vidax.checkpoint import CheckpointError, save_model  # noqa: E402
from vidax.models.hunyuan15 import (  # noqa: E402
    PRESETS,
    HunyuanVideo15Config,
    HunyuanVideo15Transformer,
    key_map,
    load,
)

pytestmark = pytest.mark.reference

# Two dual-stream and two refiner blocks, MeanFlow embedder included. diffusers fixes the ByT5
# projection's hidden width at 2048.
CONFIG = HunyuanVideo15Config(
    num_heads=2,
    head_dim=16,
    num_layers=2,
    num_refiner_layers=2,
    mlp_ratio=3.0,
    in_channels=9,
    out_channels=4,
    patch_size=(1, 1, 1),
    text_dim=24,
    text_len=7,
    byt5_dim=12,
    byt5_len=5,
    byt5_hidden=2048,
    image_dim=10,
    image_len=3,
    use_meanflow=True,
    rope_axes_dims=(4, 6, 6),
    dtype="float32",
    param_dtype="float32",
)


def _reference_model(config: HunyuanVideo15Config, seed: int = 0):
    torch.manual_seed(seed)
    pt, ph, pw = config.patch_size
    assert ph == pw
    model = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        num_layers=config.num_layers,
        num_refiner_layers=config.num_refiner_layers,
        mlp_ratio=config.mlp_ratio,
        patch_size=ph,
        patch_size_t=pt,
        text_embed_dim=config.text_dim,
        text_embed_2_dim=config.byt5_dim,
        image_embed_dim=config.image_dim,
        rope_theta=config.rope_theta,
        rope_axes_dim=config.rope_axes_dims,
        use_meanflow=config.use_meanflow,
    ).eval()
    # Randomise every weight (diffusers zero-initialises some, which would hide bugs).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        # Keep the 2048-wide ByT5 MLP from blowing the glyph tokens up by ~sqrt(2048) * 0.2.
        for p in model.context_embedder_2.parameters():
            p.mul_(0.1)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    ref = _reference_model(CONFIG)
    path = tmp_path_factory.mktemp("hunyuan15")
    ref.save_pretrained(path, safe_serialization=True)
    return ref, load(path, CONFIG)


def _lengths_mask(lengths, size):
    return np.arange(size)[None] < np.asarray(lengths)[:, None]


def _inputs(seed, b=2, t=2, h=3, w=4, image=True):
    rng = np.random.default_rng(seed)
    c = CONFIG
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    image_embeds = normal(b, c.image_len, c.image_dim)
    return dict(
        x=normal(b, t, h, w, c.in_channels),
        timestep=np.array([999.0, 37.5][:b], np.float32),
        text=normal(b, c.text_len, c.text_dim),
        text_mask=_lengths_mask([4, c.text_len][:b], c.text_len),
        byt5=normal(b, c.byt5_len, c.byt5_dim),
        # One prompt has no glyph text at all (an all-False mask), as the pipeline produces.
        byt5_mask=_lengths_mask([2, 0][:b], c.byt5_len),
        image_embeds=image_embeds if image else np.zeros_like(image_embeds),
        timestep_r=np.array([500.0, 20.0][:b], np.float32),
    )


def _reference(ref, inputs, timestep_r=True):
    t = lambda a: torch.from_numpy(np.asarray(a))
    with torch.no_grad():
        out = ref(
            t(inputs["x"]).permute(0, 4, 1, 2, 3),
            t(inputs["timestep"]),
            t(inputs["text"]),
            t(inputs["text_mask"].astype(np.int64)),
            timestep_r=t(inputs["timestep_r"]) if timestep_r else None,
            encoder_hidden_states_2=t(inputs["byt5"]),
            encoder_attention_mask_2=t(inputs["byt5_mask"].astype(np.int64)),
            image_embeds=t(inputs["image_embeds"]),
            return_dict=False,
        )[0]
    return to_numpy(out.permute(0, 2, 3, 4, 1))


def test_image_to_video_matches_diffusers(models):
    ref, model = models
    inputs = _inputs(0)
    want = _reference(ref, inputs)
    assert np.isfinite(want).all()
    got = jax.jit(lambda kw: model(kw.pop("x"), kw.pop("timestep"), **kw))(dict(inputs))
    assert got.dtype == jnp.float32
    assert_close(got, want, 1e-4, "hunyuanvideo-1.5 i2v output")


def test_text_to_video_matches_diffusers_with_absent_inputs(models):
    """diffusers' t2v (all-zero image embeddings, all-False glyph masks, no timestep_r) equals
    leaving those inputs out, and equals passing the zero image embeddings explicitly."""
    ref, model = models
    inputs = _inputs(1, image=False)
    inputs["byt5_mask"][:] = False
    want = _reference(ref, inputs, timestep_r=False)

    @jax.jit
    def both(x, t, text, mask, image_embeds):
        return model(x, t, text, mask), model(x, t, text, mask, image_embeds=image_embeds)

    got, explicit = both(
        *(inputs[k] for k in ("x", "timestep", "text", "text_mask", "image_embeds"))
    )
    assert_close(got, want, 1e-4, "hunyuanvideo-1.5 t2v output (inputs absent)")
    assert_close(explicit, want, 1e-4, "hunyuanvideo-1.5 t2v output (zero image embeds)")


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


def test_misshaped_checkpoint_names_the_key(models, tmp_path):
    import safetensors.torch

    ref, _ = models
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    key = "transformer_blocks.1.attn.norm_added_k.weight"
    state[key] = torch.ones(CONFIG.head_dim + 2)
    safetensors.torch.save_file(state, tmp_path / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load(tmp_path, CONFIG)


def test_preset_matches_diffusers_defaults():
    config = PRESETS["hunyuanvideo1.5"]
    assert_preset_matches_diffusers_defaults(
        diffusers.HunyuanVideo15Transformer3DModel,
        HunyuanVideo15Transformer,
        config,
        key_map(config),
    )
