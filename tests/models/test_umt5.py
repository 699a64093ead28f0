"""UMT5 encoder: config validation, shapes, masking invariances, checkpoint errors, tokenizer."""

import dataclasses
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.text._tokenizers import WORDS, word_tokenizer_json

from vidax.checkpoint import CheckpointError, export_state, save_file, save_model
from vidax.models.umt5 import (
    PRESETS,
    Tokenizer,
    UMT5Encoder,
    key_map,
    load,
    position_buckets,
)
from vidax.sharding import PARAM_AXES, make_mesh, use_mesh

TINY = PRESETS["tiny"]


@nnx.jit
def _apply(model, ids, mask=None):
    return model(ids, mask)


@pytest.fixture(scope="module")
def model():
    return UMT5Encoder(TINY, rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(d_model=0), "d_model"),
        (dict(num_heads=-1), "num_heads"),
        (dict(relative_attention_num_buckets=7), "even"),
        (dict(relative_attention_num_buckets=2), ">= 4"),
        (dict(relative_attention_max_distance=8), "max_distance"),
        (dict(eps=0.0), "eps"),
        (dict(dtype="float16"), "dtype"),
        (dict(param_dtype="int8"), "param_dtype"),
    ],
)
def test_config_rejects_bad_values(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


def test_xxl_preset_builds_abstractly_with_logical_axes():
    config = PRESETS["umt5-xxl"]
    assert (config.vocab_size, config.d_model, config.d_ff, config.num_layers) == (
        256_384,
        4096,
        10_240,
        24,
    )
    abstract = nnx.eval_shape(lambda: UMT5Encoder(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    leaves = jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert sum(int(np.prod(v.shape)) for v in leaves) == config.num_params
    for v in leaves:
        axes = v.get_metadata()["out_sharding"]
        assert len(axes) == len(v.shape)
        assert set(axes) - {None} <= PARAM_AXES, axes
        assert v.get_value().dtype == jnp.bfloat16
    blocks = jax.tree.leaves(params["blocks"], is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert all(v.get_metadata()["out_sharding"][0] == "layers" for v in blocks)
    assert all(v.shape[0] == config.num_layers for v in blocks)


def test_position_buckets_are_symmetric_in_direction():
    b = position_buckets(40, num_buckets=32, max_distance=128)
    half = 16
    assert b.shape == (40, 40) and np.all(np.diag(b) == 0)
    # Keys after the query use the upper half, with the same distance bucketing.
    upper = np.triu_indices(40, 1)
    assert np.all(b[upper] >= half)
    np.testing.assert_array_equal(b[upper] - half, b.T[upper])
    # Exact buckets for small distances, then monotone non-decreasing in distance.
    np.testing.assert_array_equal(b[0, 1:9] - half, np.arange(1, 9))
    assert np.all(np.diff(b[0, 1:]) >= 0)


def test_forward_shape_dtype_and_default_mask(model):
    ids = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 9)), jnp.int32)
    out = _apply(model, ids)
    assert out.shape == (2, 9, TINY.d_model) and out.dtype == jnp.float32
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(out, _apply(model, ids, jnp.ones((2, 9), bool)))
    # T5 layer norm output: per-token RMS equals the final norm scale's (ones at init).
    rms = np.sqrt(np.mean(np.square(np.asarray(out)), axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-3)


def test_real_tokens_ignore_padding_content_and_amount(model):
    rng = np.random.default_rng(1)
    n = 7
    real = rng.integers(1, TINY.vocab_size, (1, n))
    outs = []
    for width, pad in ((n, 0), (16, 0), (32, 5)):
        ids = np.full((1, width), pad)
        ids[:, :n] = real
        mask = np.arange(width)[None] < n
        outs.append(
            np.asarray(_apply(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask)))[:, :n]
        )
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[2], outs[0], rtol=1e-5, atol=1e-5)
    # ...while real tokens do interact: changing one changes the others' outputs.
    ids = real.copy()
    ids[0, -1] = (ids[0, -1] + 1) % TINY.vocab_size
    changed = np.asarray(_apply(model, jnp.asarray(ids, jnp.int32)))[:, : n - 1]
    assert np.abs(changed - outs[0][:, : n - 1]).max() > 1e-4


def test_bfloat16_tracks_float32(model):
    config = dataclasses.replace(TINY, dtype="bfloat16", param_dtype="bfloat16")
    low = UMT5Encoder(config, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    nnx.update(low, jax.tree.map(lambda x: x.astype(jnp.bfloat16), state))
    ids = jnp.asarray(np.random.default_rng(2).integers(0, TINY.vocab_size, (2, 12)), jnp.int32)
    want, got = np.asarray(_apply(model, ids)), np.asarray(_apply(low, ids))
    assert got.dtype == np.float32
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match="input_ids"):
        model(jnp.zeros((5,), jnp.int32))
    with pytest.raises(ValueError, match="mask"):
        model(jnp.zeros((1, 5), jnp.int32), jnp.ones((1, 4), bool))


# -- checkpoints ---------------------------------------------------------------------------------


def test_save_load_round_trip(model, tmp_path):
    save_model(model, tmp_path / "m.safetensors", key_map(TINY))
    loaded = load(tmp_path / "m.safetensors", TINY)
    ids = jnp.asarray([[3, 1, 4, 1, 5]], jnp.int32)
    np.testing.assert_array_equal(_apply(loaded, ids), _apply(model, ids))


def _tensors(model):
    return export_state(nnx.state(model, nnx.Param), key_map(TINY))


def test_missing_key_is_named(model, tmp_path):
    tensors = _tensors(model)
    del tensors["encoder.block.1.layer.1.DenseReluDense.wi_1.weight"]
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"encoder\.block\.1\.layer\.1\.DenseReluDense\.wi_1"):
        load(tmp_path / "m.safetensors", TINY)


def test_missing_embedding_is_named(model, tmp_path):
    tensors = _tensors(model)
    del tensors["shared.weight"]
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"shared\.weight"):
        load(tmp_path / "m.safetensors", TINY)


def test_wrong_shape_and_extra_layer_are_named(model, tmp_path):
    tensors = _tensors(model)
    key = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    tensors[key] = np.zeros((8, TINY.num_heads), np.float32)
    tensors["encoder.block.2.layer.0.layer_norm.weight"] = np.ones(TINY.d_model, np.float32)
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError) as e:
        load(tmp_path / "m.safetensors", TINY)
    assert key in str(e.value) and "encoder.block.2.layer.0.layer_norm.weight" in str(e.value)


def test_corrupt_or_absent_checkpoint_raises(model, tmp_path):
    save_model(model, tmp_path / "m.safetensors", key_map(TINY))
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=re.escape("m.safetensors")):
        load(tmp_path / "m.safetensors", TINY)
    with pytest.raises(CheckpointError, match="not found"):
        load(tmp_path / "absent.safetensors", TINY)


# -- tokenizer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("eos_post_processor", [False, True])
def test_tokenizer_appends_eos_pads_and_masks(tmp_path, eos_post_processor):
    tok = Tokenizer(
        word_tokenizer_json(tmp_path / "tokenizer.json", eos_post_processor=eos_post_processor)
    )
    assert (tok.eos_id, tok.pad_id) == (1, 0)
    ids, mask = tok.encode(["a red cube", "the blue sphere rolls", "purple"], max_length=6)
    assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == mask.shape == (3, 6)
    np.testing.assert_array_equal(ids[0], [3, 4, 5, 1, 0, 0])
    np.testing.assert_array_equal(ids[1], [10, 6, 7, 8, 1, 0])
    np.testing.assert_array_equal(ids[2], [2, 1, 0, 0, 0, 0])  # unknown word -> <unk>, then EOS
    np.testing.assert_array_equal(mask.sum(1), [4, 5, 2])
    assert np.all(mask == (np.arange(6)[None] < mask.sum(1)[:, None]))


def test_tokenizer_truncates_keeping_eos(tmp_path):
    tok = Tokenizer(word_tokenizer_json(tmp_path / "tokenizer.json"))
    ids, mask = tok.encode("a red cube rolls over the floor", max_length=4)
    np.testing.assert_array_equal(ids, [[3, 4, 5, 1]])
    assert mask.all()
    ids, mask = tok.encode("", max_length=3)
    np.testing.assert_array_equal(ids, [[1, 0, 0]])
    np.testing.assert_array_equal(mask, [[True, False, False]])
    with pytest.raises(ValueError, match="max_length"):
        tok.encode("a", max_length=0)
    with pytest.raises(TypeError):
        tok.encode(["a", 3])


def test_tokenizer_finds_files_in_a_directory(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(WORDS)] * 20),
        model_writer=model,
        vocab_size=30,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    (tmp_path / "spiece.model").write_bytes(model.getvalue())
    sp_tok = Tokenizer(tmp_path)
    assert sp_tok.path.name == "spiece.model" and (sp_tok.eos_id, sp_tok.pad_id) == (1, 0)
    ids, mask = sp_tok.encode(["a red cube", "the floor"], max_length=10)
    assert ids[0, mask[0].sum() - 1] == 1 and ids[1, mask[1].sum() - 1] == 1
    assert np.all(ids[~mask] == 0)
    word_tokenizer_json(tmp_path / "tokenizer.json")
    assert Tokenizer(tmp_path).path.name == "tokenizer.json"  # preferred, as in HF folders
    assert Tokenizer(tmp_path).identity != sp_tok.identity


def test_tokenizer_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape("tokenizer.json or spiece.model")):
        Tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape("absent.json")):
        Tokenizer(tmp_path / "absent.json")
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match="unrecognised"):
        Tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape("broken.json")):
        Tokenizer(tmp_path / "broken.json")
    (tmp_path / "broken.model").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match=re.escape("broken.model")):
        Tokenizer(tmp_path / "broken.model")
    path = word_tokenizer_json(tmp_path / "noeos.json", specials=("<pad>", "<unk>"))
    with pytest.raises(ValueError, match="EOS"):
        Tokenizer(path)


@pytest.mark.parametrize("strategy", ["tp_sp"])  # covers embed->fsdp and heads/mlp->tensor
def test_sharded_load_and_forward_match_single_device(model, tmp_path, strategy):
    save_model(model, tmp_path / "m.safetensors", key_map(TINY))
    mesh = make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    sharded = load(tmp_path / "m.safetensors", TINY, mesh=mesh, strategy=strategy)
    assert not sharded.blocks.ffn.wi_0.kernel[...].sharding.is_fully_replicated
    ids = jnp.asarray(np.random.default_rng(3).integers(0, TINY.vocab_size, (4, 10)), jnp.int32)
    mask = jnp.arange(10)[None] < jnp.asarray([[10], [7], [3], [1]])
    with use_mesh(mesh, strategy):
        got = _apply(sharded, ids, mask)
    np.testing.assert_allclose(got, _apply(model, ids, mask), rtol=1e-5, atol=1e-5)
