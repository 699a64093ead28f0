"""Persistent block-sparse attention (PBSA): query tiles attend to selected blocks of a KV pool.

`pbsa` is the Pallas kernel (TPU Mosaic, GPU Triton, interpretable on CPU) with a `custom_vjp`;
`pbsa_reference` is its spec in plain `jnp`; both can rotate keys on read (`key_angles`, the
rotation `rotate_keys` applies). The index format is documented in
`vidax.kernels.pbsa.index`; `update_pool`, `gather_blocks` and `block_means` maintain and
summarise the pool.
"""

from vidax.kernels.pbsa.index import (
    canonicalize_selection,
    selection_from_mask,
    selection_mask,
)
from vidax.kernels.pbsa.kernel import BACKENDS, BlockSizes, pbsa
from vidax.kernels.pbsa.pool import block_means, gather_blocks, update_pool
from vidax.kernels.pbsa.reference import pbsa_reference, rotate_keys

__all__ = [
    "BACKENDS",
    "BlockSizes",
    "block_means",
    "canonicalize_selection",
    "gather_blocks",
    "pbsa",
    "pbsa_reference",
    "rotate_keys",
    "selection_from_mask",
    "selection_mask",
    "update_pool",
]
