"""The accelerator runtime's start-up noise, hidden unless asked for (`vidax --verbose`).

With the `tpu` extra installed (libtpu, for `vidax plan`) on a host without a TPU, starting jax's
backends, or building a compile-only TPU topology, makes libtpu's C++ logging print its failed
initialisation ("Failed to find host bounds ...", "E0000 ... INVALID_ARGUMENT ...") straight to
the process's stderr. Those lines mean nothing here; a backend that really fails still raises.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

_verbose = False


def set_verbose(verbose: bool) -> None:
    """`True` lets the runtime's start-up lines through (the CLI's `--verbose`)."""
    global _verbose
    _verbose = verbose


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Sends file descriptor 2 (where native libraries write) to /dev/null for the block,
    unless verbose. Python's own `sys.stderr` is flushed first so nothing of ours is lost."""
    if _verbose:
        yield
        return
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def libtpu_without_tpu() -> bool:
    """libtpu is installed but this host has no TPU device files."""
    has_tpu = any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0"))
    return not has_tpu and importlib.util.find_spec("libtpu") is not None


def start_backends() -> None:
    """Starts jax's backends now, quietly where libtpu would only print its failure to start."""
    import jax

    if not libtpu_without_tpu():
        return
    # A RuntimeError here is raised again, with its message shown, by the first use of a device.
    with quiet_native_stderr(), contextlib.suppress(RuntimeError):
        jax.devices()
