"""The job queue behind `vidax serve`: one worker thread per model, jobs in submission order.

    queue = JobQueue(max_jobs=100, max_queue=16)
    job = queue.submit(request)          # QueueFull past max_queue waiting or running jobs
    async for event in queue.follow(job):  # every event so far, then each new one
        ...
    queue.close()

A worker loads its model on first use and keeps it (compiled programs stay cached), runs one
job at a time, and publishes events (`progress`, `chunk` with a causal model's decoded frames,
then `done` or `failed`) that any number of followers read at their own pace: a follower that
goes away takes nothing with it. Finished videos are kept until there are more than `max_jobs`
(the oldest go first) or the queue closes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import logging
import queue as queues
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from vidax import models, pipeline
from vidax.errors import USER_ERRORS
from vidax.forcing import load_causal
from vidax.forcing.command import check, stream_generate
from vidax.models.weights import load_text_encoder
from vidax.serve.requests import VideoRequest
from vidax.video import to_uint8, write_video

log = logging.getLogger("vidax.serve")

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"


class QueueFull(Exception):
    """More jobs are waiting or running than the queue takes."""


@dataclasses.dataclass(eq=False, kw_only=True)
class Job:
    """One requested video: its settings, state, timings and the events published so far."""

    id: str
    request: VideoRequest
    path: Path
    submitted: float = dataclasses.field(default_factory=time.time)  # seconds since the epoch
    started: float | None = None
    finished_at: float | None = None
    status: str = QUEUED
    phase: str = QUEUED
    progress: float = 0.0
    error: str | None = None
    frames_done: int = 0
    timings: dict = dataclasses.field(default_factory=dict)
    choices: list[dict] | None = None
    events: list[dict] = dataclasses.field(default_factory=list)
    _watchers: set = dataclasses.field(default_factory=set, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in (DONE, FAILED)

    def publish(self, event: dict) -> None:
        """Appends `event` (thread-safe) and wakes every follower."""
        with self._lock:
            self.events.append(event)
            watchers = list(self._watchers)
        for wake in watchers:
            wake()

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "status": self.status,
            "phase": self.phase,
            "progress": round(self.progress, 4),
            "frames_done": self.frames_done,
            "error": self.error,
            "settings": self.request.settings(),
            "submitted": self.submitted,
            "started": self.started,
            "finished": self.finished_at,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "choices": self.choices,
            "content": f"/v1/videos/{self.id}/content" if self.status == DONE else None,
        }


# run(job, report): generates job.request into job.path; report(phase, progress, **extra)
# publishes a progress event; report("chunk", progress, frames=...) a chunk of frames.
Runner = Callable[[Job, Callable[..., None]], None]


class JobQueue:
    """Jobs per model, run one at a time by that model's worker thread, in submission order.

    Args:
      max_jobs: finished videos kept (the oldest are deleted beyond it).
      max_queue: jobs waiting or running at once, all models together; `submit` raises
        `QueueFull` beyond it.
      workdir: where videos are written (default: a temporary folder removed by `close`).
      run: what a worker does with a job (default: `Generator().run`, the real models).
    """

    def __init__(
        self,
        *,
        max_jobs: int = 100,
        max_queue: int = 16,
        workdir: str | Path | None = None,
        run: Runner | None = None,
    ):
        if max_jobs < 1:
            raise ValueError(f"--max-jobs must be >= 1, got {max_jobs}")
        if max_queue < 1:
            raise ValueError(f"--max-queue must be >= 1, got {max_queue}")
        self.max_jobs, self.max_queue = max_jobs, max_queue
        self._tmp: str | None = None
        if workdir is None:
            workdir = self._tmp = tempfile.mkdtemp(prefix="vidax-serve-")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._run = run if run is not None else Generator().run
        self._jobs: dict[str, Job] = {}  # in submission order
        self._queues: dict[str, queues.Queue] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._following = True

    def submit(self, request: VideoRequest) -> Job:
        """Queues `request` behind the jobs already waiting for its model."""
        with self._lock:
            if self._closed:
                raise QueueFull("the server is shutting down")
            pending = sum(not j.finished for j in self._jobs.values())
            if pending >= self.max_queue:
                raise QueueFull(
                    f"{pending} videos are waiting or being made, the most this server queues "
                    f"(--max-queue {self.max_queue}): try again when one is done"
                )
            job_id = f"v{next(self._ids)}"
            job = Job(id=job_id, request=request, path=self.workdir / f"{job_id}.mp4")
            self._jobs[job_id] = job
            if request.model not in self._queues:
                self._queues[request.model] = queues.Queue()
                thread = threading.Thread(
                    target=self._work,
                    args=(self._queues[request.model],),
                    name=f"vidax-serve-{request.model}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
            self._queues[request.model].put(job)
        job.publish({"type": QUEUED, "id": job_id})
        return job

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        """Every job kept, oldest first."""
        with self._lock:
            return list(self._jobs.values())

    async def follow(
        self, job: Job, start: int = 0, keepalive: float = 15.0
    ) -> AsyncIterator[tuple[int, dict | None]]:
        """(index, event) for every event of `job` from `start` on (a client that reconnects
        resumes where it was), then each new one until it is done or failed; (index, None)
        after `keepalive` seconds of silence (a server-sent-events comment keeps connections
        open). Leaving early (a client that disconnects) is harmless."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a late publish
                loop.call_soon_threadsafe(wake.set)

        with job._lock:
            job._watchers.add(notify)
        try:
            sent = max(0, start)
            while self._following:
                wake.clear()
                new = job.events[sent:]  # append-only: a slice is a consistent prefix
                for i, event in enumerate(new, start=sent):
                    yield i, event
                sent += len(new)
                if (
                    job.events
                    and job.events[-1]["type"] in (DONE, FAILED)
                    and (sent >= len(job.events))
                ):
                    return
                if not new:
                    try:
                        await asyncio.wait_for(wake.wait(), keepalive)
                    except TimeoutError:
                        yield sent, None
        finally:
            with job._lock:
                job._watchers.discard(notify)

    def stop_following(self) -> None:
        """Ends every `follow` (a server shutting down closes its event streams at once)."""
        self._following = False
        for job in self.jobs():
            with job._lock:
                watchers = list(job._watchers)
            for wake in watchers:
                wake()

    def close(self) -> None:
        """Stops the workers after their current job and deletes a temporary workdir."""
        self.stop_following()
        with self._lock:
            self._closed = True
            for q in self._queues.values():
                q.put(None)
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=30)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _work(self, jobs: queues.Queue) -> None:
        while (job := jobs.get()) is not None:
            if self._closed:
                continue
            self._execute(job)

    def _execute(self, job: Job) -> None:
        job.started = started = time.time()
        job.timings["queued_seconds"] = started - job.submitted
        job.status = job.phase = RUNNING
        job.publish({"type": RUNNING, "id": job.id})

        def report(phase: str, progress: float, **extra) -> None:
            job.phase, job.progress = phase, min(1.0, max(job.progress, progress))
            job.frames_done = extra.get("frames_done", job.frames_done)
            kind = "chunk" if "frames" in extra else "progress"
            job.publish({"type": kind, "phase": phase, "progress": job.progress, **extra})

        try:
            self._run(job, report)
        except USER_ERRORS as e:
            job.error = str(e)
        except Exception as e:  # a bug: keep the server and the other jobs going, say why
            log.error("job %s failed:\n%s", job.id, traceback.format_exc())
            job.error = f"{type(e).__name__}: {e}"
        job.finished_at = time.time()
        job.timings["total_seconds"] = job.finished_at - started
        if job.error is None:
            job.status, job.phase, job.progress = DONE, DONE, 1.0
            job.publish({"type": DONE, "video": job.to_json()})
        else:
            job.status = job.phase = FAILED
            job.publish({"type": FAILED, "error": job.error, "video": job.to_json()})
        self._evict()

    def _evict(self) -> None:
        with self._lock:
            finished = [j for j in self._jobs.values() if j.finished]
            for job in finished[: max(0, len(finished) - self.max_jobs)]:
                del self._jobs[job.id]
                job.path.unlink(missing_ok=True)


class Generator:
    """Runs jobs on real models, each loaded on its first job and kept.

    Non-causal presets go through `vidax.pipeline.generate` (progress per denoising step, DVG's
    choices); causal presets through `vidax.forcing.command.stream_generate`, each decoded
    chunk published as PNG frames as soon as it exists.
    """

    def __init__(self) -> None:
        self._models: dict[str, dict] = {}

    def run(self, job: Job, report: Callable[..., None]) -> None:
        r = job.request
        started = time.perf_counter()
        parts = self._models.get(r.model)
        if parts is None:
            report("loading", 0.0)
            parts = self._models[r.model] = _load(r.model, r.causal)
            job.timings["load_seconds"] = time.perf_counter() - started
        if r.causal:
            self._stream(job, parts, report)
        else:
            self._generate(job, parts, report)

    def _generate(self, job: Job, parts: dict, report: Callable[..., None]) -> None:
        r = job.request
        steps = r.steps
        assert steps is not None, "`requests.parse` fills in steps for non-causal models"
        report("denoising", 0.0, step=0, steps=steps)

        def on_step(i: int) -> None:
            report("denoising", (i + 1) / steps, step=i + 1, steps=steps)

        started = time.perf_counter()
        video = pipeline.generate(
            parts["spec"],
            prompt=r.prompt,
            num_frames=r.frames,
            height=r.height,
            width=r.width,
            steps=r.steps,
            seed=r.seed,
            accel=r.accel,
            budget=r.budget,
            transformer=parts["transformer"],
            vae=parts["vae"],
            text_encoder=parts["text_encoder"],
            on_step=on_step,
        )
        generated = time.perf_counter()
        job.timings["denoise_seconds"] = video.denoise_seconds or 0.0
        # The prompt's embedding and the VAE decode: all of `generate` but the denoising.
        job.timings["text_and_decode_seconds"] = (
            generated - started - job.timings["denoise_seconds"]
        )
        if video.choices:
            job.choices = [
                {"family": c.family, "schedule": c.schedule.describe(), "cost": float(c.cost)}
                for c in video.choices
            ]
        if video.frames is None:
            raise ValueError(f"model {r.model!r} has no VAE: no video to write")
        report("encoding", 1.0)
        write_video(job.path, video.frames, video.fps)
        job.frames_done = int(video.frames.shape[0])
        job.timings["encode_seconds"] = time.perf_counter() - generated

    def _stream(self, job: Job, parts: dict, report: Callable[..., None]) -> None:
        r = job.request
        started = time.perf_counter()
        total = check(parts["preset"], frames=r.frames, height=r.height, width=r.width)
        state = {"chunks": 0, "frames": 0}
        report("streaming", 0.0)

        def on_frames(pixels: np.ndarray) -> None:
            state["chunks"] += 1
            state["frames"] += pixels.shape[0]
            if state["chunks"] == 1:
                job.timings["first_chunk_seconds"] = time.perf_counter() - started
            report(
                "streaming",
                (state["chunks"] - 1) / total,
                index=state["chunks"] - 1,
                frames=[_png(frame) for frame in pixels],
                frames_done=state["frames"],
            )

        def on_chunk(done: int, total: int, written: int) -> None:
            report("streaming", done / total, chunk=done, chunks=total, frames_done=written)

        result = stream_generate(
            parts["preset"],
            r.prompt,
            job.path,
            frames=r.frames,
            height=r.height,
            width=r.width,
            seed=r.seed,
            transformer=parts["transformer"],
            vae=parts["vae"],
            on_chunk=on_chunk,
            on_frames=on_frames,
        )
        job.timings["chunk_seconds_mean"] = float(np.mean(result.chunk_seconds))


def _load(model: str, causal: bool) -> dict:
    """A model's parts, loaded once per server."""
    if causal:
        preset = models.get_causal(model)
        return {
            "preset": preset,
            "transformer": load_causal(preset, "sparse"),
            "vae": preset.spec.load_vae(),
        }
    spec = models.get(model)
    return {
        "spec": spec,
        "transformer": spec.load(),
        "vae": spec.load_vae(),
        "text_encoder": None if spec.text_config is None else load_text_encoder(spec, None),
    }


def _png(frame: np.ndarray) -> str:
    """An (H, W, 3) frame in [0, 1] as a `data:image/png;base64,...` URL."""
    data = iio.imwrite("<bytes>", to_uint8(frame[None])[0], extension=".png")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
