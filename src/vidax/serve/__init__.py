"""`vidax serve`: a local web page and HTTP API that make videos and stream them as they are made.

- `create_app`: the Starlette app (page, API, server-sent events).
- `JobQueue`: one worker per model, jobs in submission order, finished videos kept to a limit.
- `parse`, `VideoRequest`: a request validated with the command line's one-line errors.

Needs the `serve` extra (starlette, uvicorn): `pip install -e ".[serve]"`. Names are imported
on first use, so `vidax` (which registers the command) starts without the extra.
"""

import importlib

_EXPORTS = {
    "create_app": "vidax.serve.app",
    "Job": "vidax.serve.jobs",
    "JobQueue": "vidax.serve.jobs",
    "QueueFull": "vidax.serve.jobs",
    "VideoRequest": "vidax.serve.requests",
    "available_models": "vidax.serve.requests",
    "parse": "vidax.serve.requests",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vidax.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
