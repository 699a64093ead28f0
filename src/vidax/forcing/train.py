"""Training the causal model: causal initialisation, then self-rollout (Self-Forcing) training.

Two stages, both on the shipped synthetic data (`vidax.data`) and both driven by the shared
loop of `vidax.train` (resumable checkpoints, EMA, JSON log):

1. **Diffusion forcing** (`diffusion_forcing_loss`, causal initialisation): the bidirectional
   weights learn block-causal attention. Clips are encoded to latents, every chunk gets its own
   noise level (a quarter of the chunks stay clean, as context), and the flow-matching loss is
   taken on the noisy chunks of one uncached block-causal forward (`forward_full`).
2. **Self-rollout** (`self_forcing_loss`): the model generates a whole video chunk by chunk
   from noise with its own KV cache -- conditioning on its own clean outputs, exactly as at
   inference, sparse selection and memory updates included. As in Self-Forcing, one random
   exit step (shared by all chunks) is run with gradients, everything else (earlier steps, the
   cache, the clean pass) without. The loss regresses the exit-step prediction onto a frozen
   teacher's many-step ODE solution from the same noisy chunk, the teacher conditioning on the
   student's own past through its own dense cache: a regression-to-teacher loss on
   self-generated context. The sparse stage starts from the trained dense model with its
   backbone frozen (`backbone_lr_multiplier=0`) and that dense model as the teacher: only the
   sparse heads learn (the block compression that ranks blocks and sets the memory's salience,
   through the compressed branch and the straight-through selection surrogate, and the branch
   weight; `sparse_heads="selection"`: the block scores only), so sparse training cannot
   damage what the dense model knows.

    train_stage("runs/forcing/df", StageConfig(kind="diffusion_forcing", ...), init=weights)
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vidax.data import ClipLoader, LoaderConfig
from vidax.forcing.attention import SPARSE_PARAM_NAMES
from vidax.forcing.cache import KVCache
from vidax.forcing.model import CausalWan, forward_full, save
from vidax.forcing.rollout import chunk_noise, chunk_velocity, guided_context, write_clean
from vidax.models.causal import CacheLayout, ForcingConfig
from vidax.models.registry import get_causal
from vidax.sampling import predict_x0, renoise, shift_sigmas
from vidax.text.hashed import HashedTextEmbedder
from vidax.train.dit import LatentBatches
from vidax.train.flow import SigmaSampler
from vidax.train.loop import LoopConfig, make_step, run
from vidax.train.optim import OptimConfig, make_optimizer
from vidax.train.step import init_state

KINDS = ("diffusion_forcing", "self_forcing")
# `StageConfig.sparse_heads`: the `SparseParams` each choice trains.
SPARSE_HEADS = {"all": SPARSE_PARAM_NAMES, "selection": ("compress_k",)}
WEIGHTS_FILE = "weights.safetensors"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageConfig:
    """One training stage.

    Attributes:
      kind: "diffusion_forcing" (causal init) or "self_forcing" (self-rollout).
      forcing: the student's chunking and attention (dense or sparse).
      teacher_forcing: the frozen teacher's cache (self_forcing; dense).
      steps, batch_size, seed: run length, batch, seed of data and step keys.
      num_frames, height, width: pixel clip size of diffusion forcing (1 + 4k frames).
      clean_probability: diffusion forcing: chance that a chunk stays clean (pure context).
      sigma_shift: diffusion forcing: shift of the logit-normal training noise levels.
      repeat: diffusion forcing: steps each encoded batch serves (fresh noise each step).
      latents_dir: diffusion forcing: a `vidax.train.dit` latent cache to read clips from
        instead of encoding them (None: encode with the VAE).
      cfg_dropout: diffusion forcing: chance that a clip trains on the empty caption (zero
        context), which keeps the model's unconditional prediction for a guided teacher.
      rollout_chunks: self_forcing: chunks generated per training video.
      teacher_steps: self_forcing: Euler steps of the teacher from the exit noise level to 0.
      teacher_guidance: self_forcing: classifier-free guidance scale of the teacher's
        velocity (1: unguided; > 1 guides the teacher's layout: its passes run the empty
        caption's rows beside the prompts', so the student, sampled without guidance, learns
        the guided solution).
      latent_hw, channels: self_forcing: latent frame size (h, w) and channels.
      optim: optimiser settings; `optim.lr` is the sparse-attention heads' rate.
      backbone_lr_multiplier: learning-rate factor of everything but the sparse heads (the
        Wan transformer): 1 trains it at `optim.lr`, a value in (0, 1) at a lower rate, 0
        freezes it (no gradient is taken for it, no optimiser state is kept, and the exported
        weights hold it bit for bit; the EMA covers the sparse heads only).
      sparse_heads: which sparse heads train: "all" (branch weight and block compression) or
        "selection" (the key compression only, which scores the blocks: what each tile selects
        and what the persistent memory keeps; the branch weight and the value compression stay
        as they start, zero from dense weights, so every layer stays the dense one restricted
        to its selection and training can change only *which* blocks it reads). Heads left
        out are frozen as a frozen backbone is.
      checkpoint_every, log_every, max_seconds, resumable: see `vidax.train.loop.LoopConfig`
        (`max_seconds` cuts the stage short, the cosine decay still spanning `steps`).
      export_dtype: dtype of the exported weights ("bfloat16" halves a shipped file; None: the
        parameters' own).
    """

    kind: str
    forcing: ForcingConfig
    teacher_forcing: ForcingConfig | None = None
    steps: int = 100
    batch_size: int = 2
    seed: int = 0
    num_frames: int = 33
    height: int = 64
    width: int = 64
    clean_probability: float = 0.25
    sigma_shift: float = 3.0
    repeat: int = 1
    latents_dir: str | None = None
    cfg_dropout: float = 0.0
    rollout_chunks: int = 7
    teacher_steps: int = 8
    teacher_guidance: float = 1.0
    latent_hw: tuple[int, int] = (16, 16)
    channels: int = 8
    optim: OptimConfig = dataclasses.field(
        default_factory=lambda: OptimConfig(lr=1e-4, warmup=20, weight_decay=0.0, ema_decay=0.99)
    )
    backbone_lr_multiplier: float = 1.0
    sparse_heads: str = "all"
    checkpoint_every: int = 50
    log_every: int = 10
    max_seconds: float | None = None
    resumable: bool = True
    export_dtype: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.batch_size < 1 or self.steps < 1:
            raise ValueError("batch_size and steps must be >= 1")
        if not 0.0 <= self.backbone_lr_multiplier <= 1.0:
            raise ValueError(
                f"backbone_lr_multiplier must be in [0, 1] (0 freezes the backbone), got "
                f"{self.backbone_lr_multiplier}"
            )
        if self.sparse_heads not in SPARSE_HEADS:
            raise ValueError(
                f"sparse_heads must be one of {tuple(SPARSE_HEADS)}, got {self.sparse_heads!r}"
            )
        if not 0.0 <= self.clean_probability < 1.0:
            raise ValueError(f"clean_probability must be in [0, 1), got {self.clean_probability}")
        if not 0.0 <= self.cfg_dropout < 1.0:
            raise ValueError(f"cfg_dropout must be in [0, 1), got {self.cfg_dropout}")
        if not self.teacher_guidance >= 1.0:
            raise ValueError(f"teacher_guidance must be >= 1, got {self.teacher_guidance}")
        if self.forcing.guided or (self.teacher_forcing and self.teacher_forcing.guided):
            raise ValueError(
                "ForcingConfig.guidance is inference-only: a stage trains unguided forward "
                "passes (for a guided teacher use teacher_guidance)"
            )
        if self.kind == "self_forcing":
            if self.teacher_forcing is None or self.teacher_forcing.sparse:
                raise ValueError("self_forcing needs a dense teacher_forcing config")
            if self.teacher_forcing.chunk_frames != self.forcing.chunk_frames:
                raise ValueError("teacher and student must use the same chunk_frames")
            if self.rollout_chunks < 1 or self.teacher_steps < 1:
                raise ValueError("rollout_chunks and teacher_steps must be >= 1")
        elif (self.num_frames - 1) % 4:
            raise ValueError(f"num_frames must be 1 + 4k, got {self.num_frames}")
        else:
            latent = 1 + (self.num_frames - 1) // 4
            chunk, longest = (
                self.forcing.chunk_frames,
                self.forcing.horizon + self.forcing.chunk_frames,
            )
            if latent % chunk or latent > longest:
                raise ValueError(
                    f"diffusion forcing clips of {self.num_frames} frames are {latent} latent "
                    f"frames: must be a multiple of the chunk ({chunk}) and at most horizon + "
                    f"chunk ({longest}, one block-causal forward)"
                )


# -- stage 1: diffusion forcing -------------------------------------------------------------------


def diffusion_forcing_loss(
    model: CausalWan,
    latents: jax.Array,
    context: jax.Array,
    key: jax.Array,
    forcing: ForcingConfig,
    *,
    clean_probability: float = 0.25,
    sampler: SigmaSampler | None = None,
    cfg_dropout: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Flow-matching loss of one block-causal forward with an independent noise level per chunk.

    Args:
      model: the causal model.
      latents: (b, t, h, w, c) clean latents, t a multiple of `chunk_frames`.
      context: (b, s, text_dim) text embeddings.
      key: randomness of noise levels, clean chunks and noise.
      forcing: chunking and window (the mask of `forward_full`).
      clean_probability: chance that a chunk is left clean (context without loss).
      sampler: noise levels of the noisy chunks (default: logit-normal, shift 3).
      cfg_dropout: chance that a clip's context is replaced by the empty caption's (zeros).

    Returns:
      (scalar loss over noisy chunks, metrics).
    """
    b, t = latents.shape[:2]
    n = forcing.num_chunks(t)
    sampler = SigmaSampler(shift=3.0) if sampler is None else sampler
    k_sigma, k_clean, k_noise, k_drop = jax.random.split(key, 4)
    if cfg_dropout > 0:
        keep = jax.random.uniform(k_drop, (b, 1, 1)) >= cfg_dropout
        context = jnp.where(keep, context, jnp.zeros_like(context))
    sigma = sampler(k_sigma, b * n).reshape(b, n)
    clean = jax.random.bernoulli(k_clean, clean_probability, (b, n))
    sigma = jnp.where(clean, 0.0, sigma)
    per_frame = jnp.repeat(sigma, forcing.chunk_frames, axis=1)  # (b, t)
    noise = jax.random.normal(k_noise, latents.shape, jnp.float32)
    s = per_frame[:, :, None, None, None]
    x = (1 - s) * latents + s * noise
    v = forward_full(model, x, 1000.0 * per_frame, context, forcing)
    err = jnp.mean(jnp.square(v - (noise - latents)), axis=(2, 3, 4))  # (b, t)
    weight = (per_frame > 0).astype(jnp.float32)
    loss = jnp.sum(err * weight) / jnp.maximum(weight.sum(), 1.0)
    return loss, {"noisy_fraction": weight.mean()}


# -- stage 2: self-rollout ------------------------------------------------------------------------


def teacher_solve(
    teacher: CausalWan,
    x: jax.Array,
    timestep: jax.Array,
    context: jax.Array,
    cache: KVCache,
    chunk: jax.Array,
    layout: CacheLayout,
    *,
    steps: int,
    shift: float,
) -> jax.Array:
    """The teacher's Euler ODE solution from chunk `x` at `timestep` (unshifted, x1000) to 0.

    Noise levels shift(u (1 - j / steps)) for j = 0..steps, u = timestep / 1000, the schedule
    the student's few steps are a subset of. A guided `layout` (the stage's `teacher_guidance`)
    guides every velocity (`chunk_velocity`; `context` from `guided_context`, the cache with
    both branches' rows).
    """
    u = timestep / 1000.0
    sigmas = shift_sigmas(u * (1.0 - jnp.arange(steps + 1, dtype=jnp.float32) / steps), shift)

    def step(j, x):
        v = chunk_velocity(teacher, x, sigmas[j], context, cache, chunk, layout)
        return x + (sigmas[j + 1] - sigmas[j]) * v

    return jax.lax.fori_loop(0, steps, step, x)


def self_forcing_loss(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    teacher_params: nnx.State,
    context: jax.Array,
    key: jax.Array,
    layout: CacheLayout,
    teacher_layout: CacheLayout,
    *,
    num_chunks: int,
    teacher_steps: int,
    latent_hw: tuple[int, int],
    channels: int,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Self-rollout loss: regress the exit step of each self-generated chunk onto the teacher.

    Args:
      graphdef, params: the student (`nnx.split(CausalWan)`); gradients flow into `params`
        through the exit-step forward of every chunk only.
      teacher_params: the frozen teacher's state (same graphdef).
      context: (b, s, text_dim) text embeddings.
      key: noise and exit step.
      layout: the student's cache layout (dense or sparse), unguided.
      teacher_layout: the teacher's (dense) cache layout; guided when its config's guidance
        is > 1 (the stage's `teacher_guidance`: the student, sampled without guidance, learns
        the guided solution).
      num_chunks: chunks per video.
      teacher_steps: Euler steps of the teacher's solution.
      latent_hw, channels: latent frame size and channels.

    Returns:
      (scalar loss, metrics: exit step and the mean squared distance to the teacher per chunk
      index).
    """
    cfg = layout.config
    if cfg.guided:
        raise ValueError("the student samples unguided: guide the teacher's layout instead")
    student = nnx.merge(graphdef, params)
    frozen = nnx.merge(graphdef, jax.lax.stop_gradient(params))
    teacher = nnx.merge(graphdef, jax.lax.stop_gradient(teacher_params))
    b = context.shape[0]
    shape = (b, cfg.chunk_frames, *latent_hw, channels)
    sigmas = jnp.asarray(cfg.sigmas)
    k_exit, k_noise = jax.random.split(key)
    exit_step = jax.random.randint(k_exit, (), 0, cfg.num_steps)
    t_exit = jnp.asarray(cfg.timesteps, jnp.float32)[exit_step]
    teacher_context = guided_context(context, teacher_layout)

    def velocity(model, x, i, cache, chunk):
        return chunk_velocity(model, x, sigmas[i], context, cache, chunk, layout)

    def body(carry, chunk):
        cache, teacher_cache = carry
        noise = chunk_noise(jax.random.fold_in(k_noise, chunk), shape, cfg.num_steps)

        def no_grad_step(i, x):
            x0 = predict_x0(x, sigmas[i], velocity(frozen, x, i, cache, chunk))
            return renoise(x0, noise[i + 1], sigmas[i + 1])

        x = jax.lax.stop_gradient(jax.lax.fori_loop(0, exit_step, no_grad_step, noise[0]))
        x0 = predict_x0(x, sigmas[exit_step], velocity(student, x, exit_step, cache, chunk))
        target = teacher_solve(
            teacher,
            x,
            t_exit,
            teacher_context,
            teacher_cache,
            chunk,
            teacher_layout,
            steps=teacher_steps,
            shift=cfg.shift,
        )
        err = jnp.mean(jnp.square(x0 - jax.lax.stop_gradient(target)))
        clean = jax.lax.stop_gradient(x0)
        cache = write_clean(frozen, clean, context, cache, chunk, layout)
        teacher_cache = write_clean(
            teacher, clean, teacher_context, teacher_cache, chunk, teacher_layout
        )
        return (cache, teacher_cache), err

    carry = (frozen.init_cache(layout, b), teacher.init_cache(teacher_layout, b))
    carry = jax.lax.stop_gradient(carry)
    _, errs = jax.lax.scan(body, carry, jnp.arange(num_chunks, dtype=jnp.int32))
    return errs.mean(), {"exit_step": exit_step, "first_chunk": errs[0], "last_chunk": errs[-1]}


# -- data -----------------------------------------------------------------------------------------


class TrainBatches:
    """Resumable batches for a stage: text embeddings, and VAE latents for diffusion forcing.

    Wraps `ClipLoader` and turns each batch into the arrays the step takes: "context"
    (b, s, text_dim), the captions through `embedder` (captions -> (embeds, mask), e.g.
    `HashedTextEmbedder` or `vidax.text.PromptEmbedder`), and, when `vae` is given, "latents".
    Encoding clips costs far more than a step of the tiny model on a CPU, so each encoded batch
    serves `repeat` consecutive steps (with fresh noise levels and noise each time). The state
    is the loader's (seed, step) plus the position inside the repeat; a resumed run re-encodes
    the batch it was in.
    """

    def __init__(self, config: StageConfig, *, embedder, vae=None, repeat: int = 1):
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        frames = config.num_frames if vae is not None else 1
        self.loader = ClipLoader(
            LoaderConfig(
                batch_size=config.batch_size,
                num_frames=frames,
                height=config.height,
                width=config.width,
            ),
            seed=config.seed,
        )
        self.embed = embedder
        self.vae = vae
        self.repeat = repeat
        self.used = 0  # steps served from the current batch
        self._current: dict[str, np.ndarray] | None = None

    def __next__(self) -> dict[str, np.ndarray]:
        current = self._current
        if current is None or self.used == self.repeat:
            batch = next(self.loader)
            embeds, mask = self.embed(batch["caption"])
            out = {"context": embeds * mask[..., None]}
            if self.vae is not None:
                out["latents"] = np.asarray(_encode(self.vae, jnp.asarray(batch["video"])))
            current = self._current = out
            self.used = 0
        self.used += 1
        return current

    def get_state(self) -> dict[str, int]:
        return {**self.loader.get_state(), "used": self.used}

    def set_state(self, state: dict[str, int]) -> None:
        used = int(state.get("used", self.repeat))
        if used < self.repeat and int(state["step"]) > 0:
            # Mid-repeat: step back so the next call re-encodes the batch in use.
            self.loader.set_state({"seed": state["seed"], "step": int(state["step"]) - 1})
            self._current = None
            next(self)  # encodes it again
            self.used = used
        else:
            self.loader.set_state(state)
            self._current, self.used = None, 0


@nnx.jit
def _encode(vae, video):
    return vae.encode(video)


# -- the stage driver -----------------------------------------------------------------------------


def train_stage(
    run_dir: str | os.PathLike,
    config: StageConfig,
    model: CausalWan,
    *,
    teacher: CausalWan | None = None,
    vae=None,
    embedder=None,
) -> CausalWan:
    """Trains one stage from `model`'s weights, resuming from `run_dir` if it has checkpoints.

    After every checkpoint the EMA weights are exported to `run_dir/weights.safetensors`. The
    learning rate decays (cosine) over `optim.decay_steps`, or over `steps` when that is 0.

    Args:
      run_dir: checkpoints, `log.jsonl` and the exported weights.
      config: the stage.
      model: initial weights (also fixes the architecture).
      teacher: frozen teacher (self_forcing; default: a copy of `model`).
      vae: the VAE that encodes clips (diffusion_forcing).
      embedder: captions -> (embeds (b, s, text_dim), mask (b, s)), the base model's text
        conditioning (default: `HashedTextEmbedder` at the model's text_dim, the text path of
        presets without a trained text encoder; `vidax.text.PromptEmbedder` for the others).

    Returns:
      The model with the EMA weights of the last step.
    """
    run_dir = Path(run_dir)
    graphdef, params = nnx.split(model)
    params = jax.tree.map(jnp.copy, params)  # the step donates its state: never the caller's
    wan = model.config
    optim = config.optim
    if optim.decay_steps == 0:
        optim = dataclasses.replace(optim, decay_steps=config.steps)
    key = dataclasses.replace(
        config,
        steps=1,
        checkpoint_every=1,
        log_every=1,
        max_seconds=None,
        resumable=True,
        export_dtype=None,
        optim=optim,
    )
    optimizer, step_fn = _compiled_step(graphdef, key, wan)
    state = init_state(params, optimizer)
    if config.kind == "diffusion_forcing":
        if vae is None and config.latents_dir is None:
            raise ValueError("diffusion_forcing needs the VAE or a latent cache")
    else:
        # A copy: the step donates its state, and the teacher must not alias the parameters.
        frozen = nnx.state(teacher if teacher is not None else model)
        state["teacher"] = jax.tree.map(jnp.copy, frozen)
    if embedder is None:
        embedder = HashedTextEmbedder(dim=wan.text_dim, text_len=wan.text_len)
    batches: LatentBatches | TrainBatches
    if config.kind == "diffusion_forcing" and config.latents_dir is not None:
        batches = LatentBatches(
            config.latents_dir, batch_size=config.batch_size, seed=config.seed, embedder=embedder
        )
    else:
        batches = TrainBatches(
            config,
            embedder=embedder,
            vae=vae if config.kind == "diffusion_forcing" else None,
            repeat=config.repeat if config.kind == "diffusion_forcing" else 1,
        )

    def export(step: int, state: dict[str, Any]) -> None:
        out = nnx.merge(graphdef, _exported(state, config))
        save(
            out,
            run_dir / WEIGHTS_FILE,
            metadata={"step": str(step), "stage": config.kind},
            dtype=config.export_dtype,
        )

    state = run(
        run_dir,
        state,
        step_fn,
        batches,
        LoopConfig.of(config),
        to_arrays=lambda b: {k: np.asarray(b[k]) for k in ("latents", "context") if k in b},
        meta={"stage": config},
        description=f"forcing {config.kind}",
        on_checkpoint=export,
    )
    return nnx.merge(graphdef, _exported(state, config))


def _is_sparse(path) -> bool:
    """Whether a `CausalWan` state path lies under the sparse-attention heads."""
    top = path[0]
    return getattr(top, "key", getattr(top, "name", None)) == "sparse"


def _role(path, config: StageConfig) -> str:
    """The optimiser group of a state path: "sparse" (trained sparse heads, at `optim.lr`),
    "frozen" (sparse heads `sparse_heads` leaves out) or "backbone" (at
    `backbone_lr_multiplier` times the rate; frozen at 0). The names are the optimiser state's
    keys, those of checkpoints written before `sparse_heads` existed."""
    if not _is_sparse(path):
        return "backbone"
    if config.sparse_heads == "all":
        return "sparse"
    names = {getattr(p, "key", getattr(p, "name", None)) for p in path}
    return "sparse" if names & set(SPARSE_HEADS[config.sparse_heads]) else "frozen"


def _is_frozen(path, config: StageConfig) -> bool:
    """No gradient, no optimiser state, exported as it was."""
    role = _role(path, config)
    return role == "frozen" or (role == "backbone" and config.backbone_lr_multiplier == 0)


def _exported(state: dict[str, Any], config: StageConfig) -> nnx.State:
    """The weights a stage exports: the EMA, with frozen weights taken from the parameters
    (an EMA of constant weights can still move them by rounding)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, e, p: p if _is_frozen(path, config) else e, state["ema"], state["params"]
    )


def _freeze(params: nnx.State, config: StageConfig) -> nnx.State:
    """Stops the gradient of every frozen parameter (no weight gradients are computed)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.lax.stop_gradient(x) if _is_frozen(path, config) else x, params
    )


@functools.lru_cache(maxsize=8)
def _compiled_step(graphdef: nnx.GraphDef, config: StageConfig, wan):
    """(optimizer, jitted step) of a stage; shared by runs that differ only in length."""
    optimizer = _optimizer(config)
    if config.kind == "diffusion_forcing":

        def loss_fn(params, batch, key):
            m = nnx.merge(graphdef, _freeze(params, config))
            return diffusion_forcing_loss(
                m,
                batch["latents"],
                batch["context"],
                key,
                config.forcing,
                clean_probability=config.clean_probability,
                sampler=SigmaSampler(shift=config.sigma_shift),
                cfg_dropout=config.cfg_dropout,
            )

    else:
        layout = config.forcing.layout(_grid(wan, config.latent_hw))
        assert config.teacher_forcing is not None  # StageConfig requires it for self_forcing
        # The teacher's guidance lives in its layout (its cache then holds both branches).
        teacher_forcing = dataclasses.replace(
            config.teacher_forcing, guidance=config.teacher_guidance
        )
        teacher_layout = teacher_forcing.layout(_grid(wan, config.latent_hw))

        def loss_fn(params, batch, key):
            return self_forcing_loss(
                graphdef,
                _freeze(params, config),
                batch["teacher"],
                batch["context"],
                key,
                layout,
                teacher_layout,
                num_chunks=config.rollout_chunks,
                teacher_steps=config.teacher_steps,
                latent_hw=config.latent_hw,
                channels=config.channels,
            )

    step = make_step(
        loss_fn,
        optimizer,
        ema_decay=config.optim.ema_decay,
        seed=config.seed,
        frozen=("teacher",) if config.kind == "self_forcing" else (),
    )
    return optimizer, step


def _optimizer(config: StageConfig):
    """`vidax.train.optim.make_optimizer` for the trained sparse heads, the backbone at
    `backbone_lr_multiplier` times the rate, `set_to_zero` (no state) for what is frozen."""
    heads = make_optimizer(config.optim)
    m = config.backbone_lr_multiplier
    if m == 1.0 and config.sparse_heads == "all":
        return heads
    backbone = (
        optax.set_to_zero()
        if m == 0
        else make_optimizer(dataclasses.replace(config.optim, lr=config.optim.lr * m))
    )
    transforms = {"backbone": backbone, "sparse": heads}
    if config.sparse_heads != "all":
        transforms["frozen"] = optax.set_to_zero()

    def labels(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: _role(path, config), params)

    return optax.multi_transform(transforms, labels)


def _grid(wan, latent_hw) -> tuple[int, int]:
    _, ph, pw = wan.patch_size
    return latent_hw[0] // ph, latent_hw[1] // pw


# -- the shipped tiny-causal recipe ---------------------------------------------------------------


def tiny_causal_stages(
    *,
    df_steps: int,
    final_steps: int,
    sparse_steps: int | None = None,
    sparse_heads: str = "all",
    batch_size: int = 1,
    rollout_chunks: int = 7,
    teacher_steps: int = 6,
    latent_hw: tuple[int, int] = (16, 16),
    channels: int = 8,
    latents_dir: str | None = None,
    df_batch_size: int = 4,
    df_seconds: float | None = None,
    final_seconds: float | None = None,
    resumable: bool = True,
    export_dtype: str | None = None,
    teacher_guidance: float = 1.0,
    cfg_dropout: float = 0.0,
    df_frames: int = 33,
) -> dict[str, StageConfig]:
    """The stages behind `vidax/assets/tiny-causal` (see its TRAINING.md).

    df: diffusion forcing from the bidirectional tiny weights (9-latent-frame clips from the
      tiny DiT's latent cache `latents_dir`, or encoded here, each batch serving 4 steps).
    dense: from df, `final_steps` self-rollout steps with the df model as the teacher
      (`teacher_steps` Euler steps): the Self-Forcing baseline, every weight trained.
    sparse: from the trained *dense* model, `sparse_steps` (default `final_steps`) self-rollout
      steps with sparse attention, the backbone frozen: only the sparse heads (branch weight,
      block compression, hence the scores and the memory's salience) learn. The teacher is the
      same dense model with its dense cache over the student's own past, and the target its
      own prediction at the exit step (`teacher_steps=1`: one Euler step to 0 is the x0
      prediction), so the loss measures only what the sparse cache loses against the dense
      one. The sparse heads start at zero, the rate 1e-3 is theirs alone; `sparse_heads`
      picks which of them train (`StageConfig.sparse_heads`).

    `df_frames` is the pixel length of the df clips (33: 9 latent frames, three chunks; 81: 21,
    the longest one block-causal forward covers, so that the teacher of the dense stage has seen
    real continuations as long as its cache before the window starts to roll).
    `teacher_guidance` > 1 guides the dense stage's teacher (classifier-free, the empty caption
    as the unconditional branch) and `cfg_dropout` trains df on the empty caption that often,
    so that its unconditional prediction stays usable for that teacher.
    `df_seconds` / `final_seconds` cap a stage's time (an accelerator lease), `resumable`
    False trains without orbax checkpoints (the exported weights only), `export_dtype` casts
    the exported weights (see `StageConfig`).
    """
    preset = get_causal("tiny-causal")
    # The preset's inference guidance is not a training setting: stages run unguided passes.
    dense, sparse = (dataclasses.replace(c, guidance=1.0) for c in (preset.dense, preset.sparse))
    rollout: dict[str, Any] = dict(
        kind="self_forcing",
        batch_size=batch_size,
        rollout_chunks=rollout_chunks,
        latent_hw=latent_hw,
        channels=channels,
        teacher_forcing=dense,
        checkpoint_every=10,
        log_every=5,
        seed=1,
        max_seconds=final_seconds,
        resumable=resumable,
        export_dtype=export_dtype,
    )
    return {
        "df": StageConfig(
            kind="diffusion_forcing",
            forcing=dense,
            steps=df_steps,
            batch_size=df_batch_size,
            num_frames=df_frames,
            repeat=1 if latents_dir else 4,
            latents_dir=latents_dir,
            cfg_dropout=cfg_dropout,
            optim=OptimConfig(lr=2e-4, warmup=20, weight_decay=0.0, ema_decay=0.99),
            checkpoint_every=50,
            log_every=25,
            max_seconds=df_seconds,
            resumable=resumable,
            export_dtype=export_dtype,
        ),
        "dense": StageConfig(
            forcing=dense,
            steps=final_steps,
            teacher_steps=teacher_steps,
            teacher_guidance=teacher_guidance,
            optim=OptimConfig(lr=1e-4, warmup=10, weight_decay=0.0, ema_decay=0.95),
            **rollout,
        ),
        # The gather path is the same function as PBSA's reference, about 2x faster on a CPU,
        # and the one that carries the straight-through selection surrogate.
        "sparse": StageConfig(
            forcing=dataclasses.replace(sparse, pbsa_backend="gather"),
            steps=final_steps if sparse_steps is None else sparse_steps,
            teacher_steps=1,
            backbone_lr_multiplier=0.0,
            sparse_heads=sparse_heads,
            optim=OptimConfig(lr=1e-3, warmup=10, weight_decay=0.0, ema_decay=0.95),
            **rollout,
        ),
    }
