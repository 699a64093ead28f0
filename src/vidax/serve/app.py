"""The `vidax serve` web app: one page and a small HTTP API over a `JobQueue`.

    POST /v1/videos                  {"prompt": ..., "model": "tiny", "frames": 17, ...} -> 202 {id}
    GET  /v1/videos                  every video kept, newest first
    GET  /v1/videos/{id}             status, progress, settings, timings, DVG's choices
    GET  /v1/videos/{id}/events      server-sent events: progress, causal chunks (PNG frames), done
    GET  /v1/videos/{id}/content     the mp4, once done
    GET  /v1/models                  presets with shipped weights and their defaults
    GET  /                           the page

Bad fields are a 422 whose `error` is the command line's one-line message; a full queue is a
429.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, StreamingResponse
from starlette.routing import Route

from vidax.serve.jobs import DONE, FAILED, JobQueue, QueueFull, Runner
from vidax.serve.requests import DEFAULT_MAX_PIXELS, ModelInfo, available_models, parse

PAGE = Path(__file__).parent / "static" / "index.html"


def create_app(
    *,
    default_model: str = "tiny",
    max_jobs: int = 100,
    max_queue: int = 16,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    workdir: str | Path | None = None,
    run: Runner | None = None,
    models: list[ModelInfo] | None = None,
) -> Starlette:
    """The app; its job queue starts with the app and is closed when the app stops.

    Args:
      default_model: the model of requests that name none (preselected on the page).
      max_jobs / max_queue / workdir / run: see `JobQueue`.
      max_pixels: the largest frames x height x width a request may ask for.
      models: the presets offered (default: `available_models()`, those whose weights ship).

    Raises:
      ValueError: `default_model` is not among the models offered, or a limit below 1.
    """
    models = available_models() if models is None else models
    names = [m.name for m in models]
    if default_model not in names:
        raise ValueError(
            f"--model {default_model!r} is not a model this server can run (weights shipped): "
            f"{', '.join(names) or 'none'}"
        )
    if max_pixels < 1:
        raise ValueError(f"--max-pixels must be >= 1, got {max_pixels}")
    jobs = JobQueue(max_jobs=max_jobs, max_queue=max_queue, workdir=workdir, run=run)

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE.read_text())

    async def list_models(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "default": default_model,
                "max_pixels": max_pixels,
                "models": [m.to_json() for m in models],
            }
        )

    async def submit(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return _error(400, f"the request body is not JSON: {e}")
        try:
            video = parse(body, available=names, default_model=default_model, max_pixels=max_pixels)
        except ValueError as e:
            return _error(422, str(e))
        try:
            job = jobs.submit(video)
        except QueueFull as e:
            return _error(429, str(e), headers={"Retry-After": "5"})
        return JSONResponse(
            {"id": job.id, "status": job.status, "url": f"/v1/videos/{job.id}"}, status_code=202
        )

    async def list_videos(request: Request) -> JSONResponse:
        return JSONResponse({"videos": [j.to_json() for j in reversed(jobs.jobs())]})

    async def video(request: Request) -> JSONResponse:
        job = _job(jobs, request)
        return job if isinstance(job, JSONResponse) else JSONResponse(job.to_json())

    async def content(request: Request):
        job = _job(jobs, request)
        if isinstance(job, JSONResponse):
            return job
        if job.status == FAILED:
            return _error(409, f"video {job.id} failed: {job.error}")
        if job.status != DONE:
            return _error(409, f"video {job.id} is {job.status} ({job.progress:.0%})")
        return FileResponse(job.path, media_type="video/mp4", filename=f"vidax-{job.id}.mp4")

    async def events(request: Request):
        job = _job(jobs, request)
        if isinstance(job, JSONResponse):
            return job

        # A browser that reconnects sends the id of the last event it had: resume after it.
        last = request.headers.get("last-event-id", "")
        start = int(last) + 1 if last.isdigit() else 0

        async def lines():
            async for i, event in jobs.follow(job, start):
                if event is None:
                    yield ": keepalive\n\n"
                else:
                    yield f"id: {i}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(
            lines(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        try:
            yield
        finally:
            jobs.close()

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/v1/models", list_models),
            Route("/v1/videos", submit, methods=["POST"]),
            Route("/v1/videos", list_videos, methods=["GET"]),
            Route("/v1/videos/{id}", video),
            Route("/v1/videos/{id}/content", content),
            Route("/v1/videos/{id}/events", events),
        ],
        lifespan=lifespan,
    )
    app.state.jobs = jobs
    return app


def _job(jobs: JobQueue, request: Request):
    job = jobs.get(request.path_params["id"])
    if job is None:
        return _error(
            404,
            f"no video {request.path_params['id']!r} (finished videos beyond "
            f"--max-jobs {jobs.max_jobs} are deleted, oldest first)",
        )
    return job


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)
