"""Numerical parity of the UMT5 encoder and tokenizer against transformers (tiny, random)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from tests.reference._torch import assert_close, to_numpy, train_sentencepiece

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from vidax.checkpoint import export_state, open_checkpoint, save_file  # noqa: E402
from vidax.models.umt5 import (  # noqa: E402
    PRESETS,
    Tokenizer,
    UMT5Config,
    from_hf_config,
    key_map,
    load,
    relative_position_bucket,
)

pytestmark = pytest.mark.reference

CONFIG = UMT5Config(
    vocab_size=101,
    d_model=48,
    d_kv=8,  # n * k = 32 != d: the projections are not square
    d_ff=72,
    num_layers=3,
    num_heads=4,
    relative_attention_num_buckets=16,
    relative_attention_max_distance=20,  # < sequence length, so the far buckets are exercised
    dtype="float32",
    param_dtype="float32",
)


def _hf_config(config: UMT5Config):
    return transformers.UMT5Config(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.d_kv,
        d_ff=config.d_ff,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        layer_norm_epsilon=config.eps,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
    )


def _randomise(model, seed):
    # Layer norms initialise to ones; randomise everything so every weight is tested.
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    ref = _randomise(transformers.UMT5EncoderModel(_hf_config(CONFIG)), 0)
    path = tmp_path_factory.mktemp("umt5")
    ref.save_pretrained(path, safe_serialization=True)
    return ref, path, load(path, CONFIG)


def _ids(seed, b=3, length=40):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CONFIG.vocab_size, (b, length)).astype(np.int32)
    lengths = np.array([length, 23, 1][:b])
    mask = np.arange(length)[None, :] < lengths[:, None]
    ids = np.where(mask, ids, 0)  # pad id 0, as the tokenizer pads
    return ids, mask


def _reference(ref, ids, mask):
    with torch.no_grad():
        out = ref(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
        )
    return to_numpy(out.last_hidden_state)


def test_encoder_matches_transformers(models):
    ref, _, model = models
    ids, mask = _ids(0)
    want = _reference(ref, ids, mask)
    got = model(jnp.asarray(ids), jnp.asarray(mask))
    assert got.shape == want.shape and got.dtype == jnp.float32
    # Padded positions included: they attend to the real tokens exactly as in transformers.
    assert_close(got, want, 1e-4, "last_hidden_state")


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (16, 20), (8, 9), (64, 256), (4, 3)])
def test_bucket_function_matches_transformers(buckets, max_distance):
    attn = transformers.models.umt5.modeling_umt5.UMT5Attention(
        _hf_config(
            dataclasses.replace(
                CONFIG,
                relative_attention_num_buckets=buckets,
                relative_attention_max_distance=max_distance,
            )
        ),
        has_relative_attention_bias=True,
    )
    relative = torch.arange(-600, 601)
    want = attn._relative_position_bucket(relative).numpy()
    got = relative_position_bucket(relative.numpy(), num_buckets=buckets, max_distance=max_distance)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got)) <= set(range(buckets))


@pytest.mark.parametrize("embedding_key", ["shared.weight", "encoder.embed_tokens.weight", "both"])
def test_tied_embedding_key_variants(models, tmp_path, embedding_key):
    ref, path, _ = models
    tensors = {k: np.array(v) for k, v in open_checkpoint(path).items()}
    table = to_numpy(ref.shared.weight)
    tensors.pop("shared.weight", None)
    tensors.pop("encoder.embed_tokens.weight", None)
    for key in ("shared.weight", "encoder.embed_tokens.weight"):
        if embedding_key in (key, "both"):
            tensors[key] = table
    save_file(tensors, tmp_path / "model.safetensors")
    model = load(tmp_path / "model.safetensors", CONFIG)
    np.testing.assert_array_equal(np.asarray(model.embed_tokens[...]), table)


def test_full_encoder_decoder_checkpoint_loads_encoder(tmp_path):
    ref = _randomise(transformers.UMT5ForConditionalGeneration(_hf_config(CONFIG)), 1)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    assert any(k.startswith("decoder.") for k in open_checkpoint(tmp_path))
    model = load(tmp_path, CONFIG)
    ids, mask = _ids(1)
    want = _reference(ref.encoder, ids, mask)
    assert_close(model(jnp.asarray(ids), jnp.asarray(mask)), want, 1e-4, "encoder of UMT5ForCG")


def test_export_round_trips_to_transformers_layout(models):
    ref, _, model = models
    from flax import nnx

    exported = export_state(nnx.state(model, nnx.Param), key_map(CONFIG))
    want = {k: to_numpy(v) for k, v in ref.state_dict().items()}
    assert set(exported) <= set(want)
    assert set(want) - set(exported) <= {"encoder.embed_tokens.weight"}  # the tied alias
    for key, value in exported.items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)


def test_xxl_parameter_count_matches_transformers():
    xxl = PRESETS["umt5-xxl"]
    with torch.device("meta"):
        ref = transformers.UMT5EncoderModel(_hf_config(xxl))
    assert ref.config.d_model == 4096
    assert sum(p.numel() for p in ref.parameters()) == xxl.num_params


@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory):
    return train_sentencepiece(tmp_path_factory.mktemp("spm"))


@pytest.mark.parametrize("backend", ["spiece.model", "tokenizer.json"])
def test_tokenizer_matches_transformers(sentencepiece_dir, tmp_path, backend):
    ref = transformers.T5Tokenizer.from_pretrained(sentencepiece_dir)
    ref.save_pretrained(tmp_path)  # writes the tokenizer.json transformers converted to
    prompts = [
        "a red cube",
        "the green cone spins slowly over the cat in the sunlight on the grass",
        "",
        "Zebra ÜBER 42!",  # unknown pieces
    ]
    max_length = 12
    want = ref(prompts, padding="max_length", max_length=max_length, truncation=True)
    folder = sentencepiece_dir if backend == "spiece.model" else tmp_path
    ids, mask = Tokenizer(folder / backend).encode(prompts, max_length=max_length)
    np.testing.assert_array_equal(ids, np.array(want["input_ids"]))
    np.testing.assert_array_equal(mask, np.array(want["attention_mask"], bool))
    assert mask[1].all() and ids[1, -1] == ref.eos_token_id  # truncated, EOS kept


def test_config_json_keeps_the_checkpoint_dtype_and_matches_in_float32(models):
    import json

    ref, path, _ = models
    hf = json.loads((path / "config.json").read_text())
    config = from_hf_config(hf, dtype="float32")
    assert config.param_dtype == "float32"  # saved from float32 torch weights
    assert (
        from_hf_config({**hf, "torch_dtype": "bfloat16", "dtype": None}).param_dtype == "bfloat16"
    )
    model = load(path, config)
    ids, mask = _ids(2)
    want = _reference(ref, ids, mask)
    got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
