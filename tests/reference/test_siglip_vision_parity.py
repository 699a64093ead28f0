"""Numerical parity of the SigLIP vision encoder and preprocessing against transformers (tiny,
random)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vidax.checkpoint import open_checkpoint  # noqa: E402
from vidax.models.siglip_vision import (  # noqa: E402
    PRESETS,
    SiglipVisionConfig,
    from_hf_config,
    load,
    preprocess,
)

pytestmark = pytest.mark.reference

# 30 / 7: a patch that does not divide the image, as so400m's 384 / 14.
CONFIG = SiglipVisionConfig(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=2,
    image_size=30,
    patch_size=7,
)


def _hf_config(config: SiglipVisionConfig, **kwargs):
    return transformers.SiglipVisionConfig(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        image_size=config.image_size,
        patch_size=config.patch_size,
        **kwargs,
    )


def _randomise(model, seed):
    # Layer norms initialise to ones and biases to zeros: randomise every weight.
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


def _pixels(seed, config=CONFIG, b=2):
    shape = (b, config.image_size, config.image_size, config.num_channels)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _run(model, pixels):
    with torch.no_grad():
        return model(
            pixel_values=torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))),
            output_hidden_states=True,
        )


@pytest.mark.parametrize("use_head", [True, False])
def test_encoder_matches_transformers(tmp_path, use_head):
    ref = _randomise(
        transformers.SiglipVisionModel(_hf_config(CONFIG, vision_use_head=use_head)), 0
    )
    ref.save_pretrained(tmp_path, safe_serialization=True)
    assert any(k.startswith("head.") for k in open_checkpoint(tmp_path)) == use_head
    assert from_hf_config(json.loads((tmp_path / "config.json").read_text())) == CONFIG
    model = load(tmp_path, CONFIG)
    pixels = _pixels(0)
    want = _run(ref, pixels)
    # HunyuanVideo-1.5 I2V's read: last_hidden_state, every token post-layer-normed.
    last = model(jnp.asarray(pixels))
    assert last.shape == (2, CONFIG.num_tokens, CONFIG.hidden_size) and last.dtype == jnp.float32
    assert_close(last, to_numpy(want.last_hidden_state), 1e-5, "last_hidden_state")
    assert len(want.hidden_states) == CONFIG.num_hidden_layers + 1
    for i in (0, 1, -1):
        got = model.hidden_states(jnp.asarray(pixels), i)
        assert_close(got, to_numpy(want.hidden_states[i]), 1e-5, f"hidden_states[{i}]")


def test_full_siglip_checkpoint_loads_the_vision_tower(tmp_path):
    # A two-tower `SiglipModel` nests the encoder under "vision_model." beside the text half
    # and the logit scale and bias, which the loader skips by name.
    config = transformers.SiglipConfig(
        vision_config=_hf_config(CONFIG).to_dict(),
        text_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=8,
        ),
    )
    ref = _randomise(transformers.SiglipModel(config), 1)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    keys = set(open_checkpoint(tmp_path))
    assert "vision_model.post_layernorm.weight" in keys and "logit_bias" in keys
    model = load(tmp_path, from_hf_config(json.loads((tmp_path / "config.json").read_text())))
    pixels = _pixels(1)
    with torch.no_grad():
        want = ref.vision_model(
            pixel_values=torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))
        )
    assert_close(model(jnp.asarray(pixels)), to_numpy(want.last_hidden_state), 1e-5, "last")


def test_so400m_preset_matches_transformers_parameter_count():
    so400m = PRESETS["siglip-so400m-patch14-384"]
    with torch.device("meta"):
        ref = transformers.SiglipVisionModel(_hf_config(so400m, vision_use_head=False))
    assert sum(p.numel() for p in ref.parameters()) == so400m.num_params
    assert from_hf_config(_hf_config(so400m).to_dict()) == so400m


@pytest.mark.parametrize("shape", [(37, 53), (61, 29), (30, 30), (384, 500)])
def test_preprocess_matches_siglip_image_processor(shape):
    rng = np.random.default_rng(sum(shape))
    images = rng.integers(0, 256, (2, *shape, 3), dtype=np.uint8)
    # The PIL backend: transformers 4's SiglipImageProcessor, and 5's fallback without
    # torchvision (5 prefers a torchvision backend, whose bicubic resize is not PIL's).
    processor_class = getattr(transformers, "SiglipImageProcessorPil", None)
    processor_class = processor_class or transformers.SiglipImageProcessor
    size = CONFIG.image_size
    processor = processor_class(size={"height": size, "width": size})
    want = processor(images=list(images), return_tensors="np")["pixel_values"]
    got = preprocess(images, CONFIG)
    assert got.shape == (2, size, size, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=0, atol=1e-6)
    # HunyuanVideo-1.5 I2V's feature_extractor at the so400m size (resample bicubic, 384 x 384).
    so400m = processor_class(size={"height": 384, "width": 384}, resample=3)
    want = so400m(images=list(images), return_tensors="np")["pixel_values"]
    got = preprocess(images, PRESETS["siglip-so400m-patch14-384"])
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=0, atol=1e-6)
