"""Sparse training without harm (issue 18, item 1): the affine branch combination, the
straight-through scored top-k, the frozen backbone and the retired gate checkpoints."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file
from tests.forcing.conftest import SMALL
from tests.forcing.test_attention import (
    ROPE,
    SPARSE,
    B,
    K,
    N,
    _filled_cache,
    _params,
    _qkv,
    _sparse,
)

from vidax.checkpoint import CheckpointError
from vidax.forcing import CausalWan, ForcingConfig, load, save
from vidax.forcing.attention import gather_attention, sparse_attention
from vidax.forcing.train import (
    WEIGHTS_FILE,
    StageConfig,
    _optimizer,
    tiny_causal_stages,
    train_stage,
)
from vidax.forcing.train_command import train_causal
from vidax.train.optim import OptimConfig


def test_branch_combination_is_affine():
    """o = (1 - w) o_sel + w o_cmp: with values all equal to one vector, every branch returns
    it, and so does the combination whatever the branch weight (the retired (1 + g_sel) o_sel +
    g_cmp o_cmp scaled it by 1 + g_sel + g_cmp)."""
    lay, layer = _filled_cache(SPARSE, 7)
    q, k, _ = _qkv(lay)
    const = jax.random.normal(jax.random.key(5), (B, 1, N, K))
    layer = dataclasses.replace(
        layer,
        v=jnp.broadcast_to(const.transpose(0, 2, 1, 3)[:, :, :, None], layer.v.shape),
        cv=jnp.broadcast_to(const.transpose(0, 2, 1, 3), layer.cv.shape),
    )
    v = jnp.broadcast_to(const, q.shape)
    params = _params(0.0)
    nnx.update(params, {"branch_bias": jnp.full((N,), 0.7), "branch_kernel": jnp.full((N, K), 0.1)})
    out, _ = _sparse(q, k, v, layer, 7, lay, params)
    np.testing.assert_allclose(out, jnp.broadcast_to(const, out.shape), atol=1e-5, rtol=1e-5)


def _selection_grads(straight_through: bool, backend: str = "gather"):
    """Gradient of a loss of the *selected branch alone* (branch weight 0, as at init) with
    respect to the sparse heads, and the output."""
    cfg = dataclasses.replace(SPARSE, pbsa_backend=backend)
    lay, layer = _filled_cache(cfg, 7)
    q, k, v = _qkv(lay)
    graphdef, state = nnx.split(_params(0.0))

    def loss(state):
        params = nnx.merge(graphdef, state)
        o, _ = sparse_attention(
            q, k, v, layer, jnp.int32(7), lay, ROPE, params, straight_through=straight_through
        )
        return jnp.sum(o * jnp.cos(o)), o

    return jax.jit(jax.grad(loss, has_aux=True))(state)


def test_straight_through_selection_leaves_the_forward_and_trains_the_scorer():
    """The scored top-k surrogate: the forward is the same to the bit, and the block scores
    (hence the compression W_k and the memory's salience) get a gradient from the selected
    branch, which without it reaches them not at all (at init the compressed branch has weight
    0, so nothing else does)."""
    grads, out = _selection_grads(True)
    grads_off, out_off = _selection_grads(False)
    np.testing.assert_array_equal(out, out_off)
    g_on, g_off = np.asarray(grads["compress_k"][...]), np.asarray(grads_off["compress_k"][...])
    assert np.isfinite(g_on).all() and np.abs(g_on).max() > 1e-6
    assert np.abs(g_off).max() == 0.0
    # The values' compression feeds only the compressed branch: no gradient at w = 0 either way.
    assert np.abs(np.asarray(grads["compress_v"][...])).max() == 0.0
    # PBSA (its reference here, the kernels on GPU/TPU) takes no logit bias: same forward, no
    # surrogate gradient.
    grads_ref, out_ref = _selection_grads(True, backend="reference")
    np.testing.assert_allclose(out_ref, out, atol=2e-5, rtol=1e-5)
    assert np.abs(np.asarray(grads_ref["compress_k"][...])).max() == 0.0


def test_straight_through_gradient_is_the_soft_selection_gradient():
    """The surrogate's gradient of one block score equals the derivative of the selected
    attention with that block's logits shifted by eps (finite difference)."""
    b, n, slots, bs, kd, tile, nq, m = 1, 2, 6, 3, 4, 2, 2, 3
    ks = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(ks[0], (b, tile * nq, n, kd))
    pool_k = jax.random.normal(ks[1], (b, n, slots, bs, kd))
    pool_v = jax.random.normal(ks[2], (b, n, slots, bs, kd))
    idx = jnp.argsort(jax.random.uniform(ks[3], (b, n, nq, slots)), axis=-1)[..., :m]
    idx = idx.astype(jnp.int32)
    valid = jnp.full((b, n, slots), bs, jnp.int32)  # every slot full
    w = jax.random.normal(jax.random.key(9), (b, tile * nq, n, kd))

    def f(s):
        bias = s - jax.lax.stop_gradient(s)
        o = gather_attention(q, pool_k, pool_v, idx, valid, tile, 0.5, bias=bias)
        return jnp.sum(o * w)

    s0 = jnp.zeros((b, n, nq, m))
    grad = jax.grad(f)(s0)
    eps = 1e-3
    bump = jnp.zeros_like(s0).at[0, 1, 1, 2].set(eps)
    shifted = lambda s: jnp.sum(
        gather_attention(q, pool_k, pool_v, idx, valid, tile, 0.5, bias=s) * w
    )
    fd = (shifted(bump) - shifted(-bump)) / (2 * eps)
    np.testing.assert_allclose(grad[0, 1, 1, 2], fd, rtol=1e-3, atol=1e-5)
    assert abs(float(fd)) > 1e-4


# -- the frozen backbone --------------------------------------------------------------------------

HW = (4, 4)
DENSE_SMALL = ForcingConfig(
    chunk_frames=1, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=1, window_frames=1,
    block_size=2,
)  # fmt: skip
SPARSE_SMALL = dataclasses.replace(
    DENSE_SMALL, attention="sparse", local_topk=1, memory_blocks=2, memory_topk=1,
    compressed_tokens=2, pbsa_backend="gather",
)  # fmt: skip


def _stage(steps: int, multiplier: float, heads: str = "all") -> StageConfig:
    return StageConfig(
        kind="self_forcing",
        forcing=SPARSE_SMALL,
        teacher_forcing=DENSE_SMALL,
        steps=steps,
        batch_size=1,
        rollout_chunks=3,
        teacher_steps=1,
        latent_hw=HW,
        channels=SMALL.in_channels,
        backbone_lr_multiplier=multiplier,
        sparse_heads=heads,
        optim=OptimConfig(lr=1e-2, warmup=1, weight_decay=0.0, ema_decay=0.5),
        checkpoint_every=steps,
        log_every=1,
    )


def _train(config: StageConfig, model, run_dir):
    """The stage from `model` against a slightly different teacher: (returned, exported)."""
    teacher = jax.tree.map(lambda x: x * 1.05, nnx.state(model))
    teacher_model = nnx.merge(nnx.graphdef(model), teacher)
    out = train_stage(run_dir, config, model, teacher=teacher_model)
    return out, load(run_dir / WEIGHTS_FILE, SMALL)


def test_frozen_backbone_is_unchanged_and_keeps_no_optimizer_state(zero_init_model, tmp_path):
    """Two self-rollout steps with backbone_lr_multiplier=0: the exported transformer is the
    initial one bit for bit (EMA included), the sparse heads moved (from zero), and the
    optimiser holds state for the sparse heads only."""
    config = _stage(2, 0.0)
    out, exported = _train(config, zero_init_model, tmp_path)
    before = nnx.state(zero_init_model.transformer)
    for model in (out, exported):
        after = nnx.state(model.transformer)
        for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
            np.testing.assert_array_equal(x, y)
        moved = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(nnx.state(model.sparse)))
        assert moved > 0
    params = nnx.state(zero_init_model)
    sizes = lambda tree: sum(int(np.size(x)) for x in jax.tree.leaves(tree))
    opt_state = _optimizer(config).init(params)
    # Adam keeps two moments per trained parameter: here only the sparse heads'.
    assert sizes(opt_state) <= 2 * sizes(nnx.state(zero_init_model.sparse)) + 16
    # The groups keep the names of checkpoints written before `sparse_heads` (resumable).
    assert set(opt_state.inner_states) == {"backbone", "sparse"}
    full = _optimizer(dataclasses.replace(config, backbone_lr_multiplier=1.0)).init(params)
    assert sizes(full) >= 2 * sizes(params)


@pytest.mark.parametrize("multiplier", [0.0, 0.5])
def test_selection_heads_train_only_the_block_scores(zero_init_model, tmp_path, multiplier):
    """sparse_heads="selection": the key compression (the block scores) moves; the branch
    weight and the value compression stay exactly zero (the layer stays the dense one
    restricted to its selection) and hold no optimiser state; the backbone trains or not by
    its multiplier alone."""
    config = _stage(2, multiplier, heads="selection")
    out, exported = _train(config, zero_init_model, tmp_path)
    before = nnx.state(zero_init_model.transformer)
    for model in (out, exported):
        sparse = model.sparse
        assert float(jnp.abs(sparse.compress_k[...]).max()) > 0
        for name in ("branch_kernel", "branch_bias", "compress_v"):
            np.testing.assert_array_equal(getattr(sparse, name)[...], 0.0)
        after = nnx.state(model.transformer)
        same = all(
            np.array_equal(x, y)
            for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        )
        assert same == (multiplier == 0.0)
    sizes = lambda tree: sum(int(np.size(x)) for x in jax.tree.leaves(tree))
    opt_state = _optimizer(config).init(nnx.state(zero_init_model))
    assert set(opt_state.inner_states) == {"backbone", "sparse", "frozen"}
    if multiplier == 0.0:  # Adam's two moments for compress_k alone
        assert sizes(opt_state) <= 2 * sizes(zero_init_model.sparse.compress_k[...]) + 16


def test_sparse_heads_are_validated():
    with pytest.raises(ValueError, match="sparse_heads must be one of"):
        _stage(1, 0.0, heads="branch")


def test_backbone_multiplier_is_validated():
    with pytest.raises(ValueError, match="backbone_lr_multiplier"):
        _stage(1, 1.5)
    with pytest.raises(ValueError, match="backbone_lr_multiplier"):
        _stage(1, -0.1)


def test_tiny_causal_sparse_stage_distils_the_dense_model_with_the_backbone_frozen():
    stages = tiny_causal_stages(df_steps=1, final_steps=5, sparse_steps=7)
    sparse, dense = stages["sparse"], stages["dense"]
    assert sparse.backbone_lr_multiplier == 0.0 and sparse.steps == 7
    assert sparse.teacher_steps == 1  # the dense model's own exit-step prediction
    assert sparse.forcing.pbsa_backend == "gather"  # carries the selection surrogate
    assert dense.backbone_lr_multiplier == 1.0 and dense.steps == 5


# -- retired gate checkpoints ---------------------------------------------------------------------


def _retired(model: CausalWan, path, gates: float) -> None:
    """`model` written in the retired gate format (gate_kernel (n, k, 2), gate_bias (n, 2))."""
    save(model, path)
    tensors = load_file(path)
    n, k = SMALL.num_heads, SMALL.head_dim
    rng = np.random.default_rng(0)
    for i in range(SMALL.num_layers):
        del (
            tensors[f"sparse_attention.{i}.branch_kernel"],
            tensors[f"sparse_attention.{i}.branch_bias"],
        )
        tensors[f"sparse_attention.{i}.gate_kernel"] = (
            gates * rng.standard_normal((n, k, 2))
        ).astype(np.float32)
        tensors[f"sparse_attention.{i}.gate_bias"] = np.zeros((n, 2), np.float32)
    save_file(tensors, path)


def test_retired_gates_load_only_when_zero(zero_init_model, tmp_path):
    """Zero retired gates (a dense model's untouched heads) are the zero branch weight: they
    load as it. Trained ones are not reinterpreted: one clear error line."""
    _retired(zero_init_model, tmp_path / "zero.safetensors", 0.0)
    loaded = load(tmp_path / "zero.safetensors", SMALL)
    for x, y in zip(
        jax.tree.leaves(nnx.state(loaded)), jax.tree.leaves(nnx.state(zero_init_model)), strict=True
    ):
        np.testing.assert_array_equal(x, y)
    _retired(zero_init_model, tmp_path / "trained.safetensors", 0.1)
    with pytest.raises(CheckpointError, match="retired gate format") as err:
        load(tmp_path / "trained.safetensors", SMALL)
    assert "\n" not in str(err.value)


def test_train_causal_checks_the_sparse_options_before_training(tmp_path):
    with pytest.raises(ValueError, match="--sparse-steps must be >= 1"):
        train_causal(root=tmp_path, only="sparse", sparse_steps=0)
    with pytest.raises(ValueError, match="--export-dtype must be float32 or bfloat16"):
        train_causal(root=tmp_path, only="sparse", export_dtype="float16")
    with pytest.raises(ValueError, match="--final-seconds must be > 0"):
        train_causal(root=tmp_path, only="sparse", final_seconds=0)
    with pytest.raises(FileNotFoundError, match=r"nowhere\.safetensors"):
        train_causal(root=tmp_path, only="sparse", sparse_init=tmp_path / "nowhere.safetensors")


def test_train_causal_df_stage_needs_the_base_weights(tmp_path, monkeypatch):
    import vidax.forcing.train_command as command

    monkeypatch.setattr(command, "missing_weights", lambda *args, **kwargs: ["transformer"])
    with pytest.raises(ValueError, match="df stage distils 'tiny', which ships no weights"):
        train_causal(root=tmp_path, only="df")
