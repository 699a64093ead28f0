"""Pallas kernels, one package each, with a plain-`jnp` reference beside every kernel.

- `vidax.kernels.pbsa`: persistent block-sparse attention over a pool of KV blocks.
"""

from vidax.kernels import pbsa

__all__ = ["pbsa"]
