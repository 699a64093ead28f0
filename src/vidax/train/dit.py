"""Stage 2: train a Wan-architecture DiT on VAE latents of `vidax.data.shapes` clips.

Clips are encoded once into a latent cache (resumable, chunked), captions embedded with the
built-in `HashedTextEmbedder`; the DiT then regresses the flow-matching velocity, with the
caption dropped (all-zero embedding, what the empty negative prompt embeds to) a tenth of the
time so that classifier-free guidance works. The first part of the run trains on the first
latent frames only (the VAE is causal, so they are exactly the latents of the clip's first
frames): cheaper steps that learn colour, shape and direction before the long clips.
`image_fraction` interleaves single-latent-frame steps (images: the clip's first frame) with
the clip steps for the whole run.

The cache also keeps which latents see an object; `object_weight` raises their share of the
low-noise loss (objects cover a few percent of the frame, background texture the rest), and
`init` starts a fine-tuning run from exported weights.

    train_dit("runs/dit", "runs/vae", DiTStageConfig(steps=600))
    train_dit("runs/dit-ft", "runs/vae", DiTStageConfig(init="runs/dit/transformer.safetensors",
                                                        object_weight=4.0, short_fraction=0.0))
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Array, Float

from vidax.checkpoint import save_model, write_atomic
from vidax.data import LoaderConfig, caption, clip_at
from vidax.models import wan_vae
from vidax.models.registry import ModelSpec, get
from vidax.models.wan import WanTransformer, key_map
from vidax.text.hashed import HashedTextEmbedder
from vidax.train.flow import SigmaSampler, velocity_error, weighted_mean
from vidax.train.loop import check_curriculum, train_module
from vidax.train.optim import OptimConfig
from vidax.train.vae import (
    STATS_FILE,
    WEIGHTS_FILE,
    load_stats,
    moments,
    object_mask,
    with_conv_impl,
)

CACHE_DIR = "latents"
TRANSFORMER_FILE = "transformer.safetensors"
_CHUNK = 64  # clips per cache file


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiTStageConfig:
    """What and how the DiT stage trains.

    Attributes:
        model: registry preset of the transformer (family "wan", hashed text encoder). The
            default is the first tiny DiT's architecture, which this CPU trainer made; the
            shipped `tiny` is trained by `vidax train all` (`vidax.train.recipe`).
        steps, batch_size, seed: run length, global batch, seed (data, init, noise).
        frames: clip length of the latent cache (1 + 4k).
        short_frames: clip length of the first `short_fraction` of the steps (their latents
            are the cache's first latent frames).
        short_fraction: share of steps on short clips (0 disables the curriculum).
        image_fraction: share of steps, spread evenly over the whole run, that train on the
            first latent frame alone (the causal VAE encodes the clip's first frame by itself
            there, so these are image steps: ~10x cheaper than 33-frame steps on the tiny DiT).
            Interleaving them keeps the video ability that a block of image steps erodes.
        cache_clips: distinct training clips (seen about steps * batch / cache_clips times).
        cfg_dropout: probability of training a sample on the empty caption.
        object_weight: extra loss weight of latents that hold an object (pixels of a palette
            colour in their 4x4 footprint), at noise levels up to `object_weight_sigma`.
            Objects cover a few percent of the frame, so without it the loss is mostly
            background texture.
        object_weight_sigma: highest noise level the object weight applies at. The weight
            depends on the clean clip, so where the noisy input leaves the layout open it
            tilts the learned distribution towards objects (at every noise level a trial run
            drew objects too large and twice); at low noise the layout is settled and the
            weight only sharpens their rendering.
        sigma: training noise-level distribution.
        init: transformer weights (diffusers safetensors) to start from instead of the
            adaLN-Zero initialisation: a fine-tuning run. Only read when the run starts.
        optim: optimiser settings (cosine decay over the steps after the warm-up).
        checkpoint_every, log_every: see `LoopConfig`.
    """

    model: str = "tiny-v1"
    steps: int = 3000
    batch_size: int = 8
    seed: int = 0
    frames: int = 33
    short_frames: int = 17
    short_fraction: float = 0.5
    image_fraction: float = 0.0
    cache_clips: int = 1024
    cfg_dropout: float = 0.1
    object_weight: float = 0.0
    object_weight_sigma: float = 0.5
    sigma: SigmaSampler = dataclasses.field(
        default_factory=lambda: SigmaSampler(mean=0.0, std=1.0, shift=3.0)
    )
    optim: OptimConfig = dataclasses.field(
        default_factory=lambda: OptimConfig(lr=1e-3, warmup=50, weight_decay=0.01, ema_decay=0.99)
    )
    init: str | None = None
    checkpoint_every: int = 100
    log_every: int = 25

    def __post_init__(self):
        spec = get(self.model)
        if spec.family != "wan" or spec.text_encoder != "hashed" or spec.vae is None:
            raise ValueError(
                f"model {self.model!r} must be a Wan preset with a VAE and the hashed text "
                "encoder to train here"
            )
        check_curriculum(self.frames, self.short_frames, self.short_fraction)
        if not 0.0 <= self.image_fraction < 1.0:
            raise ValueError(f"image_fraction must be in [0, 1), got {self.image_fraction}")
        if not 0.0 <= self.cfg_dropout < 1.0:
            raise ValueError(f"cfg_dropout must be in [0, 1), got {self.cfg_dropout}")
        if not self.object_weight >= 0.0:
            raise ValueError(f"object_weight must be >= 0, got {self.object_weight}")
        if not 0.0 <= self.object_weight_sigma <= 1.0:
            raise ValueError(
                f"object_weight_sigma must be in [0, 1], got {self.object_weight_sigma}"
            )
        if self.init is not None and not Path(self.init).is_file():
            raise FileNotFoundError(f"init weights not found: {self.init}")
        if self.steps < 1 or self.batch_size < 1 or self.cache_clips < self.batch_size:
            raise ValueError("need steps >= 1, batch_size >= 1 and cache_clips >= batch_size")

    @property
    def spec(self) -> ModelSpec:
        return get(self.model)

    @property
    def short_steps(self) -> int:
        return round(self.short_fraction * self.steps)

    def is_image_step(self, step: int) -> bool:
        """Whether 0-based `step` trains on single latent frames (`image_fraction` of all)."""
        f = self.image_fraction
        return int((step + 1) * f) > int(step * f)

    def latent_frames_at(self, step: int, short_t: int) -> int | None:
        """Latent frames of `step`'s clips: 1 (image step), `short_t` (curriculum), or None
        (whole clips)."""
        if self.is_image_step(step):
            return 1
        return short_t if step < self.short_steps else None


# ------------------------------------------------------------------------- the VAE side


def load_trained_vae(vae_run: str | os.PathLike, preset: str) -> wan_vae.WanVAE:
    """The VAE of a `train_vae` run: its exported weights, normalised by its latent stats."""
    vae_run = Path(vae_run)
    weights, stats = vae_run / WEIGHTS_FILE, vae_run / STATS_FILE
    for path in (weights, stats):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run `vidax train vae` first")
    mean, std = load_stats(stats)
    config = dataclasses.replace(wan_vae.PRESETS[preset], latents_mean=mean, latents_std=std)
    return wan_vae.load(weights, config)


def build_cache(
    cache_dir: str | os.PathLike,
    vae: wan_vae.WanVAE,
    *,
    clips: int,
    frames: int,
    seed: int,
    vae_id: str,
    batch: int = 8,
) -> None:
    """Encodes clips [0, clips) of the `vidax.data` stream `seed` into `cache_dir`.

    Each file `chunk_XXXX.npz` holds 64 clips' normalised latents (n, t, h, w, c), their
    object masks (n, t, h, w, 1) uint8 (`latent_object_mask`) and captions; files are written
    whole (temp file, rename), so a killed build resumes at the first missing chunk. A `manifest.json` pins what the cache holds.

    Raises:
        ValueError: if `cache_dir` holds a cache of different clips or another VAE.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"clips": clips, "frames": frames, "seed": seed, "vae": vae_id, "masks": True}
    path = cache_dir / "manifest.json"
    if path.exists():
        found = json.loads(path.read_text())
        if found != manifest:
            raise ValueError(
                f"{cache_dir} holds a latent cache of {found}, not {manifest}: use a new run dir"
            )
    else:
        path.write_text(json.dumps(manifest) + "\n")
    loader = LoaderConfig(batch_size=1, num_frames=frames)
    encode = nnx.jit(lambda v, x: v.normalize(moments(v, x)[0]))
    # 3D convolutions as sums of 2D ones on a CPU (`with_conv_impl`), natively elsewhere.
    encoder = with_conv_impl(vae)
    for chunk in range(-(-clips // _CHUNK)):
        out = cache_dir / f"chunk_{chunk:04d}.npz"
        if out.exists():
            continue
        indices = range(chunk * _CHUNK, min(clips, (chunk + 1) * _CHUNK))
        latents, masks, captions = [], [], []
        for start in range(indices.start, indices.stop, batch):
            rows = [
                clip_at(loader, seed, i) for i in range(start, min(indices.stop, start + batch))
            ]
            video = np.stack([frames_ for _, frames_ in rows])
            latents.append(np.asarray(encode(encoder, jnp.asarray(video)), np.float32))
            masks.append(
                np.asarray(
                    latent_object_mask(video, vae.config.temporal_factor, vae.config.spatial_factor)
                )
            )
            captions += [caption(spec) for spec, _ in rows]
        save = functools.partial(
            np.savez,
            latents=np.concatenate(latents),
            masks=np.concatenate(masks),
            captions=np.asarray(captions),
        )
        write_atomic(out, save)


def latent_object_mask(video: np.ndarray, temporal: int, spatial: int) -> jax.Array:
    """Which latents of a causal video VAE see an object pixel.

    Latent frame 0 encodes frame 0 and latent frame j >= 1 frames (j - 1) * temporal + 1 ..
    j * temporal; each latent pixel a spatial x spatial block. A latent is marked when any
    pixel of its footprint is an object (`vidax.train.vae.object_mask`: palette colours are
    bright, the background is not).

    Args:
        video: (n, 1 + temporal * k, H, W, 3) in [-1, 1].

    Returns:
        (n, 1 + k, H / spatial, W / spatial, 1) uint8 in {0, 1}.
    """
    n, frames, height, width, _ = video.shape
    if (frames - 1) % temporal or height % spatial or width % spatial:
        raise ValueError(
            f"video of {frames} frames of {height}x{width} does not fit a VAE with temporal "
            f"factor {temporal} and spatial factor {spatial}"
        )
    # jnp throughout: the on-device recipe (`vidax.train.recipe`) calls this under jit.
    pixels = object_mask(jnp.asarray(video))[..., 0] > 0
    first, rest = pixels[:, :1], pixels[:, 1:]
    rest = rest.reshape(n, (frames - 1) // temporal, temporal, height, width).any(axis=2)
    grid = jnp.concatenate([first, rest], axis=1)
    t = grid.shape[1]
    grid = grid.reshape(n, t, height // spatial, spatial, width // spatial, spatial)
    return grid.any(axis=(3, 5))[..., None].astype(jnp.uint8)


class LatentBatches:
    """Batches of cached latents and caption embeddings; state (seed, step) like `ClipLoader`.

    Batch `step` holds samples [step * b, (step + 1) * b) of an endless stream that visits the
    cache in a fresh permutation every epoch (permutation e from rng(seed, e)).

    Each batch: "latents" (b, t, h, w, c) float32 (t cut to `frames_at(step)`), "objects"
    (b, t, h, w, 1) float32 object mask, "context" (b, text_len, text_dim) float32,
    "caption" list.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        *,
        batch_size: int,
        seed: int,
        embedder: HashedTextEmbedder,
        latent_frames_at=lambda step: None,
    ):
        files = sorted(Path(cache_dir).glob("chunk_*.npz"))
        if not files:
            raise FileNotFoundError(f"no latent cache in {cache_dir}")
        data = [np.load(f) for f in files]
        if "masks" not in data[0]:
            raise ValueError(f"{cache_dir} is a latent cache without object masks: rebuild it")
        self.latents = np.concatenate([d["latents"] for d in data])
        self.masks = np.concatenate([d["masks"] for d in data])
        self.captions = [str(c) for d in data for c in d["captions"]]
        self.context = embedder(self.captions)[0]
        self.batch_size, self.seed, self.step = batch_size, seed, 0
        self.latent_frames_at = latent_frames_at
        self._perm: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.captions)

    def _rows(self, step: int) -> np.ndarray:
        n = len(self)
        rows = []
        for i in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, pos = divmod(i, n)
            if self._perm is None or self._perm[0] != epoch:
                rng = np.random.default_rng([self.seed, epoch, 0x5EED])
                self._perm = (epoch, rng.permutation(n))
            rows.append(self._perm[1][pos])
        return np.asarray(rows)

    def __next__(self) -> dict[str, Any]:
        rows = self._rows(self.step)
        t = self.latent_frames_at(self.step)
        self.step += 1
        return {
            "latents": self.latents[rows, :t],
            "objects": self.masks[rows, :t].astype(np.float32),
            "context": self.context[rows],
            "caption": [self.captions[r] for r in rows],
        }

    def get_state(self) -> dict[str, int]:
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state: dict[str, int]) -> None:
        seed, step = int(state["seed"]), int(state["step"])
        if seed != self.seed or step < 0:
            raise ValueError(f"cannot resume latent batches of seed {self.seed} from {state}")
        self.step = step


# ------------------------------------------------------------------------- the model side


def self_attention(
    q: Float[Array, "b l n k"], k: Float[Array, "b s n k"], v: Float[Array, "b s n k"]
) -> Float[Array, "b l n k"]:
    """softmax(q k^T / sqrt(k)) v with heads moved in front of tokens first.

    The same function as `vidax.nn.attention(impl="reference")`, laid out as plain batched
    matmuls: on XLA:CPU that trains the tiny DiT ~2.5x faster than the token-major einsums.
    """
    scale = q.shape[-1] ** -0.5
    qh, kh, vh = (a.swapaxes(1, 2).astype(jnp.float32) for a in (q, k, v))
    probs = jax.nn.softmax((qh * scale) @ kh.swapaxes(-1, -2), axis=-1)
    return (probs @ vh).swapaxes(1, 2).astype(q.dtype)


def forward(
    model: WanTransformer,
    x: Float[Array, "b t h w c"],
    timestep: Float[Array, " b"],
    context: Float[Array, "b s e"],
    positions: Float[Array, "l 3"] | None = None,
) -> Float[Array, "b t h w c"]:
    """`model(x, timestep, context, positions=positions)` of a `WanTransformer`, with
    `self_attention` inside."""
    tokens, grid = model.embed(x)
    cond = model.condition(timestep, context)
    rope = model.rope(grid, positions)
    tokens = model.run_blocks(tokens, cond, rope, self_attention=self_attention)
    return model.unembed(tokens, cond, grid)


def dit_loss(
    model: WanTransformer, batch: dict[str, jax.Array], key: jax.Array, config: DiTStageConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Flow-matching loss with caption dropout and object weighting.

    `batch`: "latents" (b, t, h, w, c), "objects" (b, t, h, w, 1), "context" (b, s, e) and
    optionally "positions" (l, 3), the RoPE positions of the token grid (default: integers).
    Metrics split the loss at sigma = 0.5 and report the error on object latents alone.
    """
    x0, context = batch["latents"], batch["context"]
    b = x0.shape[0]
    k_sigma, k_noise, k_drop = jax.random.split(key, 3)
    sigma = config.sigma(k_sigma, b)
    noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
    keep = jax.random.uniform(k_drop, (b,)) >= config.cfg_dropout
    context = context * keep[:, None, None].astype(context.dtype)
    objects = batch["objects"]
    positions = batch.get("positions")
    err = velocity_error(lambda x, t: forward(model, x, t, context, positions), x0, noise, sigma)
    gate = (sigma <= config.object_weight_sigma).astype(jnp.float32)[:, None, None, None, None]
    per_example = weighted_mean(err, 1.0 + config.object_weight * gate * objects)
    loss = jnp.mean(per_example)
    high = sigma >= 0.5
    n_high = jnp.maximum(high.sum(), 1).astype(jnp.float32)
    n_low = jnp.maximum((~high).sum(), 1).astype(jnp.float32)
    return loss, {
        "loss_high_noise": jnp.where(high, per_example, 0.0).sum() / n_high,
        "loss_low_noise": jnp.where(high, 0.0, per_example).sum() / n_low,
        "loss_objects": jnp.mean(weighted_mean(err, objects)),
    }


def build_model(config: DiTStageConfig) -> WanTransformer:
    """The DiT a run starts from: `config.init`'s weights, else DiT's adaLN-Zero start.

    adaLN-Zero: the timestep-to-modulation projection and the output projection start at
    zero, so every block's gates are the small learned table values (blocks start near
    identity) and the first prediction is 0 (loss = E|eps - x0|^2): the usual fast start of
    DiTs from scratch.
    """
    spec = config.spec
    if config.init is not None:
        return spec.loader(config.init, spec.config)
    model = spec.build(seed=config.seed)
    if not isinstance(model, WanTransformer):
        raise ValueError(f"the DiT stage trains Wan transformers, not {spec.family!r} ones")
    return adaln_zero(model)


def adaln_zero(model: WanTransformer) -> WanTransformer:
    """Zeroes a `WanTransformer`'s modulation and output projections in place (see
    `build_model`); returns it."""
    for layer in (model.time_proj, model.proj_out):
        layer.kernel[...] = jnp.zeros_like(layer.kernel[...])
    return model


def train_dit(
    run_dir: str | os.PathLike,
    vae_run: str | os.PathLike,
    config: DiTStageConfig,
    *,
    mesh: Mesh | None = None,
) -> nnx.Module:
    """Builds the latent cache, trains (or resumes) the DiT, exports its EMA weights.

    Writes `run_dir/latents/` (cache), `run_dir/transformer.safetensors` (diffusers layout,
    EMA weights) and returns the EMA model.
    """
    spec = config.spec
    run_dir = Path(run_dir)
    vae = load_trained_vae(vae_run, spec.vae_preset())
    if vae.config.z_dim != spec.config.in_channels:
        raise ValueError(
            f"the VAE has {vae.config.z_dim} latent channels but {config.model!r} takes "
            f"{spec.config.in_channels}"
        )
    vae_id = hashlib.sha256((Path(vae_run) / WEIGHTS_FILE).read_bytes()).hexdigest()[:16]
    build_cache(
        run_dir / CACHE_DIR,
        vae,
        clips=config.cache_clips,
        frames=config.frames,
        seed=config.seed,
        vae_id=vae_id,
    )
    short_t = vae.config.latent_frames(config.short_frames)
    batches = LatentBatches(
        run_dir / CACHE_DIR,
        batch_size=config.batch_size,
        seed=config.seed,
        embedder=HashedTextEmbedder(dim=spec.config.text_dim, text_len=spec.config.text_len),
        latent_frames_at=lambda step: config.latent_frames_at(step, short_t),
    )
    ema = train_module(
        run_dir,
        build_model(config),
        lambda model, batch, key: dit_loss(model, batch, key, config),
        batches,
        config,
        to_arrays=lambda b: {k: b[k] for k in ("latents", "objects", "context")},
        mesh=mesh,
        meta={"stage": "dit", "vae": vae_id, "config": config},
        description="dit",
    )
    save_model(ema, run_dir / TRANSFORMER_FILE, key_map(spec.config))
    return ema
