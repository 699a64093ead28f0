"""Shared fixtures for planner tests: compile-only TPU topologies (libtpu, no TPU needed)."""

import functools
import importlib.util

import pytest

from vidax.planner import load_topology

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@functools.cache
def _topology(name: str):
    return load_topology(name)


@pytest.fixture
def tpu_topology():
    """`tpu_topology("v5e:4x4")` -> a cached `Topology` over compile-only devices."""
    if not HAS_LIBTPU:
        pytest.skip("libtpu is not installed")
    return _topology
