"""Shared fixtures for planner tests: compile-only TPU topologies (libtpu, no TPU needed)."""

import functools
import importlib.util

import pytest
from tests.planner._tiny import TINY_WORKLOAD_ARGS

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


@functools.cache
def _tiny_search():
    from vidax.planner import Workload, plan

    return plan(Workload(**TINY_WORKLOAD_ARGS), "v5e:2x4", keep=2)


@pytest.fixture
def tiny_search():
    """One search for the tiny model on v5e:2x4 (2 candidates compiled), shared by the tests."""
    if not HAS_LIBTPU:
        pytest.skip("libtpu is not installed")
    return _tiny_search()
