"""Shared helpers for parity tests against torch reference implementations."""

import numpy as np


def assert_close(got, want, rel: float, what: str = "") -> None:
    """max |got - want| <= rel * max |want| (tolerance relative to the output scale)."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(np.abs(want).max(), 1e-12)
    err = np.abs(got - want).max()
    assert err <= rel * scale, f"{what}: max abs err {err:.3g} > {rel} x scale {scale:.3g}"


def to_numpy(t):
    return t.detach().float().cpu().numpy()
