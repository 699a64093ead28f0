"""vidax: a unified JAX framework for video generative models on accelerator meshes.

Subpackages are imported lazily so that ``import vidax`` stays cheap:

- ``vidax.models``    DiTs, VAEs and text encoders with a preset registry.
- ``vidax.sampling``  flow-matching solvers and the jitted denoising loop.
- ``vidax.pipeline``  text -> latents -> frames.
- ``vidax.dvg``       dynamic spatio-temporal progressive sampling.
- ``vidax.forcing``   autoregressive generation with persistent block-sparse attention.
- ``vidax.planner``   topology-aware sharding planner for TPU sub-slices.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
