"""`attention(impl="auto")`'s choice per platform, shapes, dtypes and mask, tested on CPU.

The GPU itself is faked by patching `_device` (what "auto" reads the platform and CUDA compute
capability from); only the choice is exercised here, the cuDNN kernel in test_attention_gpu.py.
"""

import importlib
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.nn.attention import (
    CHUNKED_ABOVE,
    _auto_impl,
    attention,
    attention_chunked,
    attention_reference,
    choose_impl,
)
from vidax.sharding import make_mesh, use_mesh

# The module, not the function `vidax.nn.attention` that shadows it as a package attribute.
attention_module = importlib.import_module("vidax.nn.attention")
BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32
H200 = (9, 0)
A100 = (8, 0)
# Wan 2.1 1.3B at 480p, CFG batch 2: 21 x 30 x 52 tokens, 12 heads of 128; 512 text tokens.
WAN_Q = (2, 32_760, 12, 128)
WAN_TEXT = (2, 512, 12, 128)
SMALL = (1, 64, 2, 64)


@pytest.fixture(autouse=True)
def _fresh_reports():
    attention_module._REPORTED.clear()
    yield
    attention_module._REPORTED.clear()


@pytest.mark.parametrize(
    "case, args, kwargs, want, why",
    [
        ("gpu bf16 long self-attention", ("gpu", WAN_Q, WAN_Q, BF16, False), {}, "cudnn", "takes"),
        ("gpu bf16 cross-attention", ("gpu", WAN_Q, WAN_TEXT, BF16, False), {}, "cudnn", "takes"),
        ("gpu fp16 short", ("gpu", SMALL, SMALL, F16, False), {}, "cudnn", "takes"),
        ("gpu f32 long", ("gpu", WAN_Q, WAN_Q, F32, False), {}, "chunked", "float32 inputs"),
        ("gpu f32 short", ("gpu", SMALL, SMALL, F32, False), {}, "xla", "float32 inputs"),
        ("gpu mixed dtypes", ("gpu", SMALL, SMALL, None, False), {}, "xla", "different dtypes"),
        (
            "gpu head dim not a multiple of 8",
            ("gpu", (2, 4096, 4, 100), (2, 4096, 4, 100), BF16, False),
            {},
            "xla",
            "head dim 100",
        ),
        (
            "gpu head dim 264 > 256",
            ("gpu", (2, 32_760, 4, 264), (2, 32_760, 4, 264), BF16, False),
            {},
            "chunked",
            "head dim 264",
        ),
        (
            "head dim 192 on an A100 (<= 128 before Hopper)",
            ("gpu", (2, 512, 4, 192), (2, 512, 4, 192), BF16, False),
            {"compute_capability": A100},
            "xla",
            "up to 128",
        ),
        (
            "head dim 192 on an H200",
            ("gpu", (2, 512, 4, 192), (2, 512, 4, 192), BF16, False),
            {},
            "cudnn",
            "takes",
        ),
        ("gpu boolean mask", ("gpu", WAN_Q, WAN_Q, BF16, True), {}, "chunked", "boolean mask"),
        (
            "gpu tokens split over the mesh",
            ("gpu", WAN_Q, WAN_Q, BF16, False),
            {"tokens_sharded": True},
            "chunked",
            "split over tokens",
        ),
        (
            "gpu before Ampere",
            ("gpu", SMALL, SMALL, BF16, False),
            {"compute_capability": (7, 5)},
            "xla",
            "below 8.0",
        ),
        (
            "gpu that is not CUDA",
            ("gpu", SMALL, SMALL, BF16, False),
            {"compute_capability": None},
            "xla",
            "not a CUDA device",
        ),
        ("cpu long bf16", ("cpu", WAN_Q, WAN_Q, BF16, False), {}, "chunked", "running on cpu"),
        ("cpu short bf16", ("cpu", SMALL, SMALL, BF16, False), {}, "xla", "running on cpu"),
        ("cpu cross-attention", ("cpu", WAN_Q, WAN_TEXT, F32, False), {}, "chunked", "cpu"),
        ("tpu without a mesh", ("tpu", SMALL, SMALL, BF16, False), {}, "xla", "running on tpu"),
        ("tpu long, no mesh", ("tpu", WAN_Q, WAN_Q, BF16, False), {}, "splash", "splash"),
        ("tpu long with a mask", ("tpu", WAN_Q, WAN_Q, BF16, True), {}, "chunked", "on tpu"),
        ("tpu long, 4 chips", ("tpu", WAN_Q, WAN_Q, BF16, False), {"devices": 4}, "chunked", "tpu"),
        ("tpu long, GQA", ("tpu", WAN_Q, (2, 32_760, 4, 128), BF16, False), {}, "chunked", "tpu"),
        ("tpu long, mixed dtypes", ("tpu", WAN_Q, WAN_Q, None, False), {}, "chunked", "tpu"),
    ],
)
def test_choose_impl(case, args, kwargs, want, why):
    kwargs = {"compute_capability": H200, **kwargs}
    impl, reason = choose_impl(*args, **kwargs)
    assert impl == want, case
    assert why in reason, (case, reason)


def test_off_gpu_the_rule_is_the_logit_count():
    """CPU keeps the old rule: "chunked" above CHUNKED_ABOVE logits (b*n*l*s), else "xla"."""
    at = (1, CHUNKED_ABOVE // 1024, 1, 64)
    keys = (1, 1024, 1, 64)
    assert choose_impl("cpu", at, keys, F32, False)[0] == "xla"
    assert choose_impl("cpu", (1, at[1] + 1, 1, 64), keys, F32, False)[0] == "chunked"


def _ours(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "vidax.nn.attention"]


def _fake_gpu(monkeypatch, capability=H200):
    monkeypatch.setattr(attention_module, "_device", lambda mesh=None: ("gpu", capability))


def test_gpu_fallback_is_logged_once_per_reason(monkeypatch, caplog):
    """float32 on a GPU runs the fallback (here "xla") and says why once, not every call."""
    _fake_gpu(monkeypatch)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 16, 2, 32)), F32)
    with caplog.at_level(logging.WARNING, logger="vidax.nn.attention"):
        for _ in range(3):
            out = attention(q, q, q)
        jax.jit(lambda x: attention(x, x, x))(q)
        mask = jnp.ones((1, 1, 16, 16), bool)
        attention(q.astype(BF16), q.astype(BF16), q.astype(BF16), mask=mask)
        attention(q.astype(BF16), q.astype(BF16), q.astype(BF16), mask=mask)
    np.testing.assert_allclose(out, attention_reference(q, q, q, scale=32**-0.5), atol=1e-5)
    messages = _ours(caplog)
    assert len(messages) == 2, messages
    assert "float32 inputs" in messages[0] and "boolean mask" in messages[1]


def test_no_log_off_gpu_or_when_cudnn_is_chosen(monkeypatch, caplog):
    q = jnp.zeros((1, 16, 2, 32), F32)
    with caplog.at_level(logging.WARNING, logger="vidax.nn.attention"):
        attention(q, q, q)  # the real CPU backend: no fallback to speak of
        _fake_gpu(monkeypatch)
        sds = jax.ShapeDtypeStruct((1, 16, 2, 32), BF16)
        assert _auto_impl(sds, sds, sds, None) == "cudnn"
    assert _ours(caplog) == []


@pytest.mark.parametrize(
    "strategy, want",
    [
        ("dp", "cudnn"),  # batch split only: cuDNN's partitioner takes it
        ("ulysses", "cudnn"),  # heads split, all tokens per device
        ("fsdp_sp", "chunked"),  # queries split over tokens, keys gathered
    ],
)
def test_gpu_mesh_layouts(monkeypatch, strategy, want):
    """Under a GPU mesh "auto" reads the strategy's q/k/v layout (ring and splash unchanged)."""
    _fake_gpu(monkeypatch)
    mesh = make_mesh((2, 2), ("data", "seq"), jax.devices()[:4])
    q = jax.ShapeDtypeStruct(WAN_Q, BF16)
    with use_mesh(mesh, strategy):
        assert _auto_impl(q, q, q, None) == want
        text = jax.ShapeDtypeStruct(WAN_TEXT, BF16)
        assert _auto_impl(q, text, text, None) == want


def test_explicit_cudnn_needs_a_gpu_and_supported_inputs(monkeypatch):
    q = jnp.zeros((1, 8, 1, 16), BF16)
    with pytest.raises(ValueError, match="needs an NVIDIA GPU, running on cpu"):
        attention(q, q, q, impl="cudnn")
    _fake_gpu(monkeypatch)
    with pytest.raises(ValueError, match="float32 inputs"):
        attention(q.astype(F32), q.astype(F32), q.astype(F32), impl="cudnn")
    with pytest.raises(ValueError, match="boolean mask"):
        attention(q, q, q, mask=jnp.ones((1, 1, 8, 8), bool), impl="cudnn")


@pytest.mark.parametrize("length, keys", [(200, 200), (200, 77)])
def test_chunked_bf16_matches_the_reference_with_bf16_matmuls(length, keys):
    """bf16 q/k/v: the online-softmax path multiplies in bf16 (float32 accumulation, no f32
    dot) and stays within bf16 tolerance of the float32 reference."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((2, length, 2, 64)), BF16)
    k, v = (jnp.asarray(rng.standard_normal((2, keys, 2, 64)), BF16) for _ in range(2))
    out = attention_chunked(q, k, v, scale=0.125, block=64)
    assert out.dtype == BF16
    want = attention_reference(*(x.astype(F32) for x in (q, k, v)), scale=0.125)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=2e-2)
    lowered = jax.jit(lambda q, k, v: attention_chunked(q, k, v, scale=0.125, block=64))
    dots = re.findall(
        r"dot_general.*: \((tensor<[^>]*>), (tensor<[^>]*>)\)", lowered.lower(q, k, v).as_text()
    )
    assert len(dots) == 2 and all(a.endswith("xbf16>") and b.endswith("xbf16>") for a, b in dots)
