"""What vidax reports to users as one line (the CLI's `error:` line, the server's 422), and the
one way to import an optional dependency.

    tokenizers = require_extra("tokenizers", extra="text", purpose="reading tokenizer.json")
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional package a feature needs is not installed; the message names the extra."""


# Errors a user can cause (bad flags, files, shapes, checkpoints: `CheckpointError` is a
# ValueError; a missing extra): reported by their message alone, no traceback.
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    FileNotFoundError,
    NotImplementedError,
    MissingExtraError,
)


def require_extra(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Imports `module`, or raises `MissingExtraError` naming the `pip install` that provides it.

    Only a missing `module` (or a package it needs) becomes this error; any other import failure
    (a bug in the package) propagates unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise MissingExtraError(
            f"{purpose} needs the `{e.name}` package: pip install 'vidax[{extra}]'"
        ) from None
