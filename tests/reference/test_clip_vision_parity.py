"""Numerical parity of the CLIP vision encoder and preprocessing against transformers (tiny,
random)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vidax.checkpoint import open_checkpoint  # noqa: E402
from vidax.models.clip_vision import (  # noqa: E402
    PRESETS,
    CLIPVisionConfig,
    from_hf_config,
    load,
    preprocess,
)

pytestmark = pytest.mark.reference


def _config(hidden_act: str) -> CLIPVisionConfig:
    return CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        hidden_act=hidden_act,
    )


def _hf_config(config: CLIPVisionConfig):
    return transformers.CLIPVisionConfig(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        image_size=config.image_size,
        patch_size=config.patch_size,
        num_channels=config.num_channels,
        layer_norm_eps=config.layer_norm_eps,
        hidden_act=config.hidden_act,
        projection_dim=48,
    )


def _randomise(model, seed):
    # Layer norms initialise to ones and biases to zeros: randomise every weight.
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


def _reference(ref, pixels):
    with torch.no_grad():
        out = ref(
            pixel_values=torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))),
            output_hidden_states=True,
        )
    return out


def _pixels(seed, config, b=2):
    shape = (b, config.image_size, config.image_size, config.num_channels)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("hidden_act", ["quick_gelu", "gelu"])
def test_encoder_matches_transformers(tmp_path, hidden_act):
    config = _config(hidden_act)
    ref = _randomise(transformers.CLIPVisionModel(_hf_config(config)), 0)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    assert from_hf_config(json.loads((tmp_path / "config.json").read_text())) == config
    model = load(tmp_path, config)
    pixels = _pixels(0, config)
    want = _reference(ref, pixels)
    assert len(want.hidden_states) == config.num_hidden_layers + 1
    penultimate = model.hidden_states(jnp.asarray(pixels))  # default layer=-2: Wan's read
    assert penultimate.shape == (2, config.num_tokens, config.hidden_size)
    assert_close(penultimate, to_numpy(want.hidden_states[-2]), 1e-5, "hidden_states[-2]")
    for i in (0, 1):
        got = model.hidden_states(jnp.asarray(pixels), layer=i)
        assert_close(got, to_numpy(want.hidden_states[i]), 1e-5, f"hidden_states[{i}]")
    last, pooled = model(jnp.asarray(pixels))
    assert_close(last, to_numpy(want.last_hidden_state), 1e-5, "last_hidden_state")
    assert_close(pooled, to_numpy(want.pooler_output), 1e-5, "pooler_output")


def test_projection_checkpoint_loads_the_encoder(tmp_path):
    # CLIPVisionModelWithProjection (transformers 5 keeps its "vision_model." prefix) carries
    # visual_projection.weight, which the loader skips by name.
    config = _config("gelu")
    ref = _randomise(transformers.CLIPVisionModelWithProjection(_hf_config(config)), 1)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    keys = set(open_checkpoint(tmp_path))
    assert "visual_projection.weight" in keys
    assert "vision_model.pre_layrnorm.weight" in keys
    model = load(tmp_path, config)
    pixels = _pixels(1, config)
    with torch.no_grad():
        want = ref.vision_model(
            pixel_values=torch.from_numpy(pixels.transpose(0, 3, 1, 2).copy()),
            output_hidden_states=True,
        )
    got = model.hidden_states(jnp.asarray(pixels))
    assert_close(got, to_numpy(want.hidden_states[-2]), 1e-5, "hidden_states[-2]")


def test_vit_h_preset_matches_transformers_defaults_and_parameter_count():
    vit_h = PRESETS["clip-vit-h-14"]
    with torch.device("meta"):
        ref = transformers.CLIPVisionModel(_hf_config(vit_h))
    assert sum(p.numel() for p in ref.parameters()) == vit_h.num_params
    # transformers' own defaults for a saved config pass the strict reader (full CLIPConfig too).
    full = transformers.CLIPConfig(vision_config=_hf_config(vit_h).to_dict()).to_dict()
    assert from_hf_config(full) == vit_h
    assert from_hf_config(transformers.CLIPVisionConfig().to_dict()).hidden_act == "quick_gelu"


@pytest.mark.parametrize("shape", [(37, 53), (61, 29), (224, 300)])
def test_preprocess_matches_clip_image_processor(shape):
    rng = np.random.default_rng(sum(shape))
    images = rng.integers(0, 256, (2, *shape, 3), dtype=np.uint8)
    # The PIL backend: transformers 4's CLIPImageProcessor, and 5's fallback without torchvision
    # (5 prefers a torchvision backend, whose bicubic resize is not PIL's).
    processor_class = getattr(transformers, "CLIPImageProcessorPil", None)
    processor_class = processor_class or transformers.CLIPImageProcessor
    config = _config("gelu")
    size = config.image_size
    processor = processor_class(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    want = processor(images=list(images), return_tensors="np")["pixel_values"]
    got = preprocess(images, config)
    assert got.shape == (2, size, size, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=0, atol=1e-6)
    # Wan's processor at the ViT-H size.
    default = processor_class()
    want = default(images=list(images), return_tensors="np")["pixel_values"]
    got = preprocess(images, PRESETS["clip-vit-h-14"])
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=0, atol=1e-6)
