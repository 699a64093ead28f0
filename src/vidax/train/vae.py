"""Stage 1: train a Wan-architecture VAE on `vidax.data.shapes` clips.

The VAE learns on clips cropped around their objects (the objects are what the metrics
read; the dim background is easy), short ones first and then clips as long as the ones it will
encode (a causal VAE trained on 9-frame clips drifts after frame ~12 of a 33-frame one), with
a squared error that weights object pixels up and a small KL term, from an initialisation that
skips the long plateau of the model's default one (`build_vae`). The result is exported in
the diffusers layout (`vidax.models.wan_vae.save`) together with the per-channel statistics
of its latents, which the diffusion stage normalises with.

    state = train_vae("runs/vae", VAEStageConfig(steps=1500))
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Array, Float

from vidax.data import ClipLoader, LoaderConfig, clip_at
from vidax.models.wan_vae import PRESETS, WanVAE, WanVAEConfig, save
from vidax.models.wan_vae.config import CONV_IMPLS
from vidax.models.wan_vae.model import AttentionBlock, ResidualBlock
from vidax.train.loop import check_curriculum, train_module
from vidax.train.optim import OptimConfig

STATS_FILE = "latent_stats.json"
_INIT_LOGVAR = -8.0
_INIT_MU_GAIN = 30.0
WEIGHTS_FILE = "vae.safetensors"


@dataclasses.dataclass(frozen=True, kw_only=True)
class VAEStageConfig:
    """What and how the VAE stage trains.

    Attributes:
        vae: preset name in `vidax.models.wan_vae.PRESETS` (its latent statistics are ignored:
            they are measured after training).
        steps, batch_size, seed: run length, global batch, seed of data and model init.
        frames: clip length (1 + 4k) of the last steps: as long as the clips the VAE will
            encode. Causal convolutions see zero padding before frame 0; a VAE that only saw
            9-frame clips never met frames far from it, and its latents and decodes drift
            there (measured: 27 dB at frame 8, 12 dB at frame 32 of a still scene).
        short_frames: clip length (1 + 4k) of the first `short_fraction` of the steps (the
            first frames of the same clips: ~3.5x cheaper steps that learn shapes and colours).
        short_fraction: share of steps on short clips (0 disables the curriculum).
        crop: square crop size in pixels (a multiple of the spatial factor), centred near an
            object with probability `object_crop`; 0 trains on whole frames.
        object_weight: extra weight of object (palette) pixels in the squared error.
        edge_weight: weight of an L1 loss on spatial finite differences (sharper outlines).
        kl_weight: weight of the mean KL to N(0, 1).
        optim: optimiser settings; the learning rate decays (cosine) over the steps after the
            warm-up, whatever `optim.decay_steps` says.
        checkpoint_every, log_every: see `LoopConfig`.
        conv_impl: how the VAE computes its 3D convolutions while training (`resolve_conv_impl`:
            "auto" sums 2D convolutions on a CPU); the weights are the same model either way.
    """

    vae: str = "shapes"
    steps: int = 2400
    batch_size: int = 4
    seed: int = 0
    frames: int = 33
    short_frames: int = 9
    short_fraction: float = 0.65
    crop: int = 24
    object_crop: float = 0.8
    object_weight: float = 4.0
    edge_weight: float = 0.0
    kl_weight: float = 1e-4
    optim: OptimConfig = dataclasses.field(
        default_factory=lambda: OptimConfig(lr=1.5e-3, warmup=30, weight_decay=1e-4, ema_decay=0.99)
    )
    checkpoint_every: int = 100
    log_every: int = 25
    conv_impl: str = "auto"

    def __post_init__(self):
        resolve_conv_impl(self.conv_impl)  # validates
        if self.vae not in PRESETS:
            raise ValueError(f"unknown VAE preset {self.vae!r}; known: {sorted(PRESETS)}")
        check_curriculum(self.frames, self.short_frames, self.short_fraction, min_frames=5)
        s = PRESETS[self.vae].spatial_factor
        if self.crop and (self.crop % s or not s <= self.crop <= 64):
            raise ValueError(f"crop must be 0 or a multiple of {s} in [{s}, 64], got {self.crop}")
        if self.batch_size < 1 or self.steps < 1:
            raise ValueError("batch_size and steps must be >= 1")
        for name in ("object_weight", "edge_weight", "kl_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.object_crop <= 1.0:
            raise ValueError(f"object_crop must be in [0, 1], got {self.object_crop}")

    @property
    def short_steps(self) -> int:
        return round(self.short_fraction * self.steps)

    @property
    def model_config(self) -> WanVAEConfig:
        """The preset without latent statistics (training sees raw latents), with `conv_impl`."""
        return dataclasses.replace(
            PRESETS[self.vae],
            latents_mean=None,
            latents_std=None,
            conv_impl=resolve_conv_impl(self.conv_impl),
        )


# ------------------------------------------------------------------------- fast CPU forward


def resolve_conv_impl(conv_impl: str = "auto") -> str:
    """The `WanVAEConfig.conv_impl` to train with: "auto" is "2d-sum" on a CPU backend (where
    XLA has no fast 3D convolution, see `vidax.models.wan_vae.config.CONV_IMPLS`), else
    "native"; any other value is returned as it is."""
    if conv_impl == "auto":
        return "2d-sum" if jax.default_backend() == "cpu" else "native"
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"conv_impl must be 'auto' or one of {CONV_IMPLS}, got {conv_impl!r}")
    return conv_impl


def with_conv_impl(vae: WanVAE, conv_impl: str = "auto") -> WanVAE:
    """`vae`'s weights in a VAE whose 3D convolutions run by `conv_impl` (`resolve_conv_impl`).

    The same function up to float summation order; `vae` itself is returned when nothing
    changes.
    """
    config = dataclasses.replace(vae.config, conv_impl=resolve_conv_impl(conv_impl))
    if config == vae.config:
        return vae
    out = nnx.eval_shape(lambda: WanVAE(config, rngs=nnx.Rngs(0)))
    nnx.update(out, nnx.state(vae))
    return out


def moments(vae: WanVAE, x: Float[Array, "b T H W 3"]) -> tuple[jax.Array, jax.Array]:
    """Raw posterior (mu, logvar) of pixels in [-1, 1], frame 0 then the rest as one chunk.

    Equal to `vae.moments` (which runs 4-frame chunks in a `lax.scan`), but differentiating
    through that scan is ~10x slower on CPU than through one unrolled chunk.
    """
    h0, cache = vae.encoder(x[:, :1], None)
    if x.shape[1] > 1:
        h1, _ = vae.encoder(x[:, 1:], cache)
        h0 = jnp.concatenate([h0, h1.astype(h0.dtype)], axis=1)
    h, _ = vae.quant_conv(h0)
    mu, logvar = jnp.split(h, 2, axis=-1)
    return mu, jnp.clip(logvar, -30.0, 20.0)


def decode_raw(vae: WanVAE, z: Float[Array, "b t h w c"]) -> Float[Array, "b T H W 3"]:
    """Raw latents -> pixels (unclamped), latent frame 0 then the rest as one chunk."""
    x, _ = vae.post_quant_conv(z)
    y0, cache = vae.decoder(x[:, :1], None)
    if x.shape[1] > 1:
        y1, _ = vae.decoder(x[:, 1:], cache)
        y0 = jnp.concatenate([y0, y1.astype(y0.dtype)], axis=1)
    return y0


# ------------------------------------------------------------------------- data


class CroppedClips:
    """`ClipLoader` batches cropped to `crop` x `crop`, mostly around an object.

    Before step `config.short_steps` the clips are cut to their first `short_frames` frames.
    Crop offsets come from rng(seed, step), so the iterator's state stays the loader's
    (seed, step) and a resumed run sees the same crops.
    """

    def __init__(self, config: VAEStageConfig, *, mesh: Mesh | None = None):
        self.config = config
        loader = LoaderConfig(batch_size=config.batch_size, num_frames=config.frames)
        self.loader = ClipLoader(loader, seed=config.seed, mesh=mesh)

    def __next__(self) -> dict[str, Any]:
        step = self.loader.step
        batch = next(self.loader)
        if step < self.config.short_steps:
            batch = {**batch, "video": batch["video"][:, : self.config.short_frames]}
        crop = self.config.crop
        if not crop:
            return batch
        rng = np.random.default_rng([self.config.seed, step, 0xC0])
        video = batch["video"]
        height, width = video.shape[2:4]
        out = np.empty((*video.shape[:2], crop, crop, video.shape[-1]), video.dtype)
        for i, spec in enumerate(batch["spec"]):
            if rng.uniform() < self.config.object_crop:
                obj = spec.objects[int(rng.integers(len(spec.objects)))]
                jitter = rng.uniform(-0.25, 0.25, size=2) * crop
                cx, cy = obj.position[0] * width + jitter[0], obj.position[1] * height + jitter[1]
            else:
                cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            x0 = int(np.clip(round(cx - crop / 2), 0, width - crop))
            y0 = int(np.clip(round(cy - crop / 2), 0, height - crop))
            out[i] = video[i, :, y0 : y0 + crop, x0 : x0 + crop]
        return {**batch, "video": out}

    def get_state(self) -> dict[str, int]:
        return self.loader.get_state()

    def set_state(self, state: dict[str, int]) -> None:
        self.loader.set_state(state)


# ------------------------------------------------------------------------- loss


def object_mask(x: Float[Array, "... 3"]) -> Float[Array, "... 1"]:
    """1 on palette-object pixels, 0 on background, from brightness alone.

    Every palette colour has a channel >= 0.85 on the [0, 1] scale and the background stays
    below 0.45, so a max-channel threshold halfway (0.2 on the [-1, 1] scale) separates them.
    """
    return (jnp.max(x, axis=-1, keepdims=True) > 0.2).astype(x.dtype)


def vae_loss(
    vae: WanVAE, x: Float[Array, "b T H W 3"], key: jax.Array, config: VAEStageConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Object-weighted MSE (+ optional edge L1) of a posterior sample's reconstruction, + KL.

    Squared error rather than L1: a missing object is a large error in few pixels, which L1
    weighs like many small background errors; in single-batch probes the weighted MSE
    reached in 100 steps an object PSNR (25.6 dB) that L1 was 3.7 dB short of.

    Returns:
        The loss and its parts (rec, edge, kl) plus the PSNR of the whole clip and of its
        object pixels.
    """
    mu, logvar = moments(vae, x)
    z = mu + jnp.exp(0.5 * logvar) * jax.random.normal(key, mu.shape, mu.dtype)
    y = decode_raw(vae, z).astype(jnp.float32)
    objects = object_mask(x)
    weight = 1.0 + config.object_weight * objects
    rec = jnp.mean(weight * jnp.square(y - x)) / jnp.mean(weight)
    edge = sum(
        jnp.mean(jnp.abs(jnp.diff(y, axis=a) - jnp.diff(x, axis=a))) for a in (2, 3)
    ) / jnp.float32(2.0)
    kl = 0.5 * jnp.mean(jnp.square(mu) + jnp.exp(logvar) - 1.0 - logvar)
    loss = rec + config.edge_weight * edge + config.kl_weight * kl
    err = jnp.square(jnp.clip(y, -1.0, 1.0) - x)
    object_mse = jnp.sum(objects * err) / jnp.maximum(3.0 * jnp.sum(objects), 1.0)
    return loss, {
        "rec": rec,
        "edge": edge,
        "kl": kl,
        "psnr": _psnr(jnp.mean(err)),
        "object_psnr": _psnr(object_mse),
    }


def _psnr(mse: jax.Array) -> jax.Array:
    return 10.0 * jnp.log10(4.0 / jnp.maximum(mse, 1e-10))  # peak-to-peak 2 on [-1, 1]


# ------------------------------------------------------------------------- training


def build_vae(config: VAEStageConfig) -> WanVAE:
    """A freshly initialised VAE that starts shallow, with a strong, nearly exact latent.

    Training from the model's init (torch's defaults) sits on a plateau, predicting the mean
    frame, for hundreds of steps: the posterior means come out ~0.1 while the posterior std
    is ~1, so the decoder first sees almost pure noise, and the signal fades through ~20
    residual blocks. So, as in Fixup / zero-init-residual ResNets, the last conv of every
    residual branch and every attention output projection start at zero (each block starts
    as its shortcut), `quant_conv`'s mean half is scaled by `_INIT_MU_GAIN` and its
    log-variance bias set to `_INIT_LOGVAR` (posterior std 0.02). In single-batch probes this
    reaches in 80 steps a loss that default init does not reach in 300.
    """
    vae = WanVAE(config.model_config, rngs=nnx.Rngs(config.seed))
    for _, node in nnx.iter_graph(vae):
        if isinstance(node, ResidualBlock):
            node.conv2.kernel[...] = jnp.zeros_like(node.conv2.kernel[...])
        elif isinstance(node, AttentionBlock):
            node.proj.kernel[...] = jnp.zeros_like(node.proj.kernel[...])
    z = config.model_config.z_dim
    kernel, bias = vae.quant_conv.kernel, vae.quant_conv.bias
    kernel[...] = kernel[...].at[..., :z].multiply(_INIT_MU_GAIN)
    bias[...] = bias[...].at[z:].set(_INIT_LOGVAR)
    return vae


def train_vae(
    run_dir: str | os.PathLike, config: VAEStageConfig, *, mesh: Mesh | None = None
) -> WanVAE:
    """Trains (or resumes) the VAE in `run_dir` and exports its EMA weights and statistics.

    Writes `run_dir/vae.safetensors` (diffusers layout, EMA weights) and
    `run_dir/latent_stats.json` (per-channel mean/std of the posterior means on 33-frame
    clips), and returns the EMA model.
    """
    ema = train_module(
        run_dir,
        build_vae(config),
        lambda model, batch, key: vae_loss(model, batch["video"], key, config),
        CroppedClips(config, mesh=mesh),
        config,
        to_arrays=lambda b: {"video": b["video"]},
        mesh=mesh,
        meta={"stage": "vae", "config": config},
        description="vae",
    )
    stats = latent_stats(ema, seed=config.seed + 1)
    run_dir = Path(run_dir)
    (run_dir / STATS_FILE).write_text(json.dumps(stats, indent=1) + "\n")
    save(ema, run_dir / WEIGHTS_FILE)
    return ema


def latent_stats(
    vae: WanVAE,
    *,
    clips: int = 32,
    frames: int = 33,
    seed: int = 1,
    batch: int = 8,
    draw: Callable[[int, int], Float[Array, "b T H W 3"]] | None = None,
) -> dict[str, list[float]]:
    """Per-channel mean and std of the raw posterior means over `clips` fresh clips.

    Values are rounded to 4 decimals: they are pasted into the VAE preset, and the diffusion
    stage must normalise with exactly the numbers the preset will hold.

    Args:
        vae: the VAE (raw, not normalised: its statistics are what is measured).
        clips: how many clips.
        frames, seed: clips 0 .. clips - 1 of the `vidax.data` stream `seed`, `frames` long.
        batch: clips encoded per call.
        draw: (i, n) -> the i-th batch of n clips in [-1, 1], drawn instead of the stream's
            (the recipe renders them on the device; `frames` and `seed` are then unused).
    """
    if draw is None:
        config = LoaderConfig(batch_size=1, num_frames=frames)

        def draw(i, n):
            return np.stack([clip_at(config, seed, i * batch + j)[1] for j in range(n)])

    encode = nnx.jit(lambda v, x: moments(v, x)[0])
    mus = []
    for i, start in enumerate(range(0, clips, batch)):
        mu = encode(vae, jnp.asarray(draw(i, min(batch, clips - start))))
        mus.append(np.asarray(mu, np.float64).reshape(-1, mu.shape[-1]))
    means = np.concatenate(mus)
    return {
        "mean": [round(float(v), 4) for v in means.mean(0)],
        "std": [round(float(v), 4) for v in means.std(0)],
    }


def load_stats(path: str | os.PathLike) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) from a `latent_stats.json`."""
    stats = json.loads(Path(path).read_text())
    return tuple(stats["mean"]), tuple(stats["std"])
