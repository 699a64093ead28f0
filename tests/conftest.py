"""Test set-up: 8 CPU devices, strict dtype promotion, rank promotion raises, slow-test gating.

Environment must be set before jax is imported anywhere, hence module level.
"""

import gc
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (used only to compile for TPU topologies) guards itself with /tmp/libtpu_lockfile;
# parallel or leftover test processes must not block each other.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# In-process CLI tests must not switch this process's jax onto a persistent compilation cache
# (tests/test_compile_cache.py checks the cache in subprocesses).
os.environ["VIDAX_COMPILE_CACHE"] = "0"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
# Broadcasting (d,) against (b, l, d) must be written out ([None], reshape, broadcast_to).
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("VIDAX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: use --runslow or VIDAX_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    """Keep torch from oversubscribing the (small) CI machine when it is present."""
    try:
        import torch
    except ImportError:
        yield
        return
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    yield


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops jax's compilation caches after each test module.

    XLA:CPU maps the code of every compiled program into its own memory regions; the whole
    suite compiles thousands of programs, and kept alive they pass the kernel's per-process
    limit (vm.max_map_count, 65530), at which LLVM aborts in the middle of a compile.
    """
    yield
    jax.clear_caches()
    gc.collect()
