"""bf16 end to end: parameters and activations in bf16, float32 only where numerics need it.

The bf16 models here hold the float32 models' weights rounded to bf16, so the differences are
bf16 arithmetic alone. Errors relative to max |y32| of the flow prediction, measured on CPU
over seeds 0-4 (max / rms): Wan tiny (2 layers) 0.53-0.73% / 0.56-0.59%, HunyuanVideo tiny
(1 + 1 layers) 0.69-0.78% / 0.53-0.62%; after 3 Euler steps with CFG 5 (which amplifies the
cond - uncond difference) the latent's max error is 1.1-1.5%. bf16's epsilon is 0.39%. The
bounds leave about 2.5x.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax import pipeline
from vidax.models.hunyuan import PRESETS as HUNYUAN_PRESETS
from vidax.models.hunyuan import HunyuanVideoTransformer
from vidax.models.wan import PRESETS as WAN_PRESETS
from vidax.models.wan import WanTransformer
from vidax.nn import video_positions
from vidax.sampling import FlowEuler

BF16, F32 = jnp.bfloat16, jnp.float32
MAX_REL, RMS_REL = 2e-2, 1.5e-2
SAMPLED_MAX_REL = 4e-2

WAN = dataclasses.replace(WAN_PRESETS["tiny"], num_layers=2)
HUNYUAN = dataclasses.replace(
    HUNYUAN_PRESETS["tiny"],
    num_layers=1,
    num_single_layers=1,
    num_heads=2,
    head_dim=16,
    rope_axes_dims=(4, 6, 6),
    text_dim=24,
    text_len=6,
    pooled_dim=12,
    freq_dim=32,
)


def _bf16_twin(model_cls, config, model32):
    """A bf16 (params and compute) model holding `model32`'s weights rounded to bf16."""
    config16 = dataclasses.replace(config, dtype="bfloat16", param_dtype="bfloat16")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_cls(config16, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, jax.tree.map(lambda a: a.astype(BF16), nnx.state(model32)))


def _errors(y16, y32) -> tuple[float, float]:
    d = jnp.abs(y16 - y32)
    scale = jnp.abs(y32)
    return float(d.max() / scale.max()), float(jnp.sqrt((d**2).mean() / (y32**2).mean()))


@pytest.fixture(scope="module")
def wan():
    m32 = WanTransformer(WAN, rngs=nnx.Rngs(0))
    return m32, _bf16_twin(WanTransformer, WAN, m32)


def _wan_inputs(seed=0, b=2):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((b, 3, 8, 8, WAN.in_channels)), F32)
    ctx = jnp.asarray(rng.standard_normal((b, WAN.text_len, WAN.text_dim)), F32)
    return x, jnp.linspace(100.0, 900.0, b), ctx


def test_wan_bf16_forward_tracks_float32(wan):
    m32, m16 = wan
    params = jax.tree.leaves(nnx.state(m16, nnx.Param))
    assert params and all(p.dtype == BF16 for p in params)
    inputs = _wan_inputs()
    y32 = jax.jit(lambda *a: m32(*a))(*inputs)
    y16 = jax.jit(lambda *a: m16(*a))(*inputs)
    assert y16.dtype == F32 and y16.shape == y32.shape
    max_rel, rms_rel = _errors(y16, y32)
    assert 0 < max_rel < MAX_REL and rms_rel < RMS_REL, (max_rel, rms_rel)


def test_hunyuan_bf16_forward_tracks_float32():
    m32 = HunyuanVideoTransformer(HUNYUAN, rngs=nnx.Rngs(0))
    m16 = _bf16_twin(HunyuanVideoTransformer, HUNYUAN, m32)
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), F32)
    inputs = (
        normal(2, 3, 4, 6, HUNYUAN.in_channels),
        jnp.array([100.0, 900.0]),
        normal(2, HUNYUAN.text_len, HUNYUAN.text_dim),
        jnp.arange(HUNYUAN.text_len)[None] < jnp.array([3, HUNYUAN.text_len])[:, None],
        normal(2, HUNYUAN.pooled_dim),
        jnp.full((2,), 5000.0),
    )
    forward = lambda m: jax.jit(lambda *a: m(*a, positions=video_positions(3, 2, 3)))(*inputs)
    y32, y16 = forward(m32), forward(m16)
    assert y16.dtype == F32
    max_rel, rms_rel = _errors(y16, y32)
    assert 0 < max_rel < MAX_REL and rms_rel < RMS_REL, (max_rel, rms_rel)


def test_bf16_denoising_keeps_a_float32_sampler_state(wan):
    """The latent the solver steps stays float32 (the model's bf16 output is upcast)."""
    m32, m16 = wan
    x, _, ctx = _wan_inputs(seed=1, b=1)
    run = lambda m: pipeline.denoise(
        m, x, {"context": ctx}, {"context": 0 * ctx}, solver=FlowEuler(num_steps=3), guidance=5.0
    )
    z32, z16 = run(m32), run(m16)
    assert z16.dtype == F32
    max_rel, _ = _errors(z16, z32)
    assert max_rel < SAMPLED_MAX_REL, max_rel


_DOT = re.compile(r"stablehlo\.(?:dot_general|convolution).*: \((tensor<[^>]*>), (tensor<[^>]*>)\)")


def _float32_dots(lowered_text: str) -> list[tuple[str, str]]:
    """(lhs, rhs) types of every dot/convolution with a float32 operand in StableHLO text."""
    dots = _DOT.findall(lowered_text)
    assert dots, "no dots found: has the StableHLO syntax changed?"
    return sorted((a, b) for a, b in dots if "xf32>" in a or "xf32>" in b)


@pytest.mark.parametrize("impl", ["auto", "chunked"])
def test_wan_bf16_program_has_no_float32_dot_on_the_token_path(impl):
    """The lowered program (what XLA receives: CPU's compiler would itself upcast bf16 dots,
    so the compiled CPU text is not the GPU's) multiplies tokens in bf16 only.

    Allowed float32 dots, all on (b, 1, .) per-sample vectors (their cost does not grow with
    the tokens), float32 as in the original Wan code (autocast to float32) because they set
    every block's adaLN shift/scale/gate: the timestep embedder's two linears and time_proj.
    "chunked" is the long-sequence path (before this test its logits were float32 dots).
    """
    config = dataclasses.replace(WAN, dtype="bfloat16", param_dtype="bfloat16", attention_impl=impl)
    model = nnx.eval_shape(lambda: WanTransformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    x, t, ctx = _wan_inputs()
    text = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a)).lower(state, x, t, ctx).as_text()
    d, f = config.dim, config.freq_dim
    assert _float32_dots(text) == sorted(
        [
            (f"tensor<2x1x{f}xf32>", f"tensor<{f}x{d}xf32>"),  # time_embedder.linear_1
            (f"tensor<2x1x{d}xf32>", f"tensor<{d}x{d}xf32>"),  # time_embedder.linear_2
            (f"tensor<2x1x{d}xf32>", f"tensor<{d}x{6 * d}xf32>"),  # time_proj
        ]
    )


def test_hunyuan_bf16_program_has_no_float32_dot_on_the_token_path():
    """Float32 dots only on (b, features) per-sample vectors: the timestep, guidance and
    pooled-text embedders and the adaLN modulation linears (kept float32 for the same reason
    as Wan's); every dot over tokens is bf16."""
    config = dataclasses.replace(HUNYUAN, dtype="bfloat16", param_dtype="bfloat16")
    model = nnx.eval_shape(lambda: HunyuanVideoTransformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    b, s = 2, config.text_len
    inputs = (
        jnp.zeros((b, 3, 4, 6, config.in_channels)),
        jnp.ones((b,)),
        jnp.zeros((b, s, config.text_dim)),
        jnp.ones((b, s), bool),
        jnp.zeros((b, config.pooled_dim)),
        jnp.ones((b,)),
    )
    forward = lambda st, *a: nnx.merge(graphdef, st)(*a, positions=video_positions(3, 2, 3))
    f32 = _float32_dots(jax.jit(forward).lower(state, *inputs).as_text())
    assert f32, "the conditioning embedders should stay float32"
    rank = lambda t: t.count("x")  # tensor<2x32xf32> has rank 2
    assert all(rank(a) == 2 and a.startswith(f"tensor<{b}x") for a, _ in f32), f32
