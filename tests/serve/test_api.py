"""`vidax serve`'s HTTP API on the shipped tiny models: happy paths, the command line's errors as
422s, the queue limit, concurrent submissions, a client leaving mid-stream."""

import base64
import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import imageio.v3 as iio
import pytest
from tests.serve.conftest import CAUSAL, TINY
from typer.testing import CliRunner

from vidax.cli import app as cli
from vidax.forcing.rollout import TRACE_COUNT
from vidax.video import read_video

httpx = pytest.importorskip("httpx")
TestClient = pytest.importorskip("starlette.testclient").TestClient
create_app = pytest.importorskip("vidax.serve.app").create_app

runner = CliRunner()


def _client(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=120)


def _submit(client, **fields) -> str:
    response = client.post("/v1/videos", json={"prompt": "a red circle bouncing", **fields})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def _events(client, job_id: str, stop_after: str | None = None) -> list[tuple[float, dict]]:
    """(arrival time, event) of a job's server-sent events, to its end (or to `stop_after`)."""
    out = []
    with client.stream("GET", f"/v1/videos/{job_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append((time.monotonic(), json.loads(line[len("data: ") :])))
                if out[-1][1]["type"] in ("done", "failed", stop_after):
                    break
    return out


def _wait(client, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = client.get(f"/v1/videos/{job_id}").json()
        if video["status"] in ("done", "failed"):
            return video
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not finish in {timeout}s")


def _frames(client, job_id: str, tmp_path):
    response = client.get(f"/v1/videos/{job_id}/content")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "video/mp4"
    path = tmp_path / f"{job_id}.mp4"
    path.write_bytes(response.content)
    return read_video(path)


def test_happy_path_reports_each_step_then_serves_the_mp4(server, tmp_path):
    client = _client(server)
    job_id = _submit(client, **TINY, seed=3)
    events = [e for _, e in _events(client, job_id)]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["queued", "running"] and kinds[-1] == "done", kinds
    steps = [e["step"] for e in events if e.get("phase") == "denoising"]
    assert steps == [0, 1, 2]  # the start, then each of the 2 steps as it ends
    progress = [e["progress"] for e in events if e["type"] == "progress"]
    assert progress == sorted(progress) and progress[-1] == 1.0

    video = client.get(f"/v1/videos/{job_id}").json()
    assert video["status"] == "done" and video["error"] is None
    assert video["settings"] == {
        "prompt": "a red circle bouncing",
        "model": "tiny",
        "frames": 9,
        "height": 32,
        "width": 32,
        "steps": 2,
        "seed": 3,
        "accel": "none",
        "budget": None,
        "causal": False,
    }
    assert {"queued_seconds", "denoise_seconds", "encode_seconds", "total_seconds"} <= set(
        video["timings"]
    )
    assert video["choices"] is None
    assert _frames(client, job_id, tmp_path).shape == (9, 32, 32, 3)
    assert job_id in [v["id"] for v in client.get("/v1/videos").json()["videos"]]
    assert "<video" in client.get("/").text


def test_models_are_the_presets_whose_weights_ship(server):
    info = _client(server).get("/v1/models").json()
    names = [m["name"] for m in info["models"]]
    assert {"tiny", "tiny-causal"} <= set(names) and info["default"] == "tiny"
    assert "wan2.1-1.3b" not in names  # `vidax models`: needs --checkpoint
    causal = {m["name"]: m["causal"] for m in info["models"]}
    assert causal["tiny-causal"] and not causal["tiny"]


def test_dvg_says_what_it_chose(server):
    client = _client(server)
    job_id = _submit(client, **{**TINY, "steps": 4}, accel="dvg", budget=0.8)
    video = _wait(client, job_id)
    assert video["status"] == "done", video
    assert video["settings"]["accel"] == "dvg" and video["settings"]["budget"] == 0.8
    (choice,) = video["choices"]
    assert choice["family"] in ("spatial", "temporal", "joint", "none")
    assert 0 < choice["cost"] <= 1 and "->" in choice["schedule"]


def _cli_error(args: list[str], tmp_path) -> str:
    result = runner.invoke(
        cli, ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4"), *args]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ")
    return line[len("error: ") :]


@pytest.mark.parametrize(
    "fields, cli_args",
    [
        ({"frames": 10}, ["--frames", "10"]),
        ({"height": 30, "width": 32}, ["--height", "30", "--width", "32"]),
        ({"model": "nope"}, ["--model", "nope"]),
        ({"model": "tiny-v1"}, ["--model", "tiny-v1"]),
        ({"steps": 0}, ["--steps", "0"]),
        ({"accel": "dvg", "budget": 2}, ["--accel", "dvg", "--budget", "2"]),
        ({"budget": 0.5}, ["--budget", "0.5"]),
        ({"accel": "fast"}, ["--accel", "fast"]),
        ({"model": "tiny-causal", "frames": 13}, ["--model", "tiny-causal", "--frames", "13"]),
    ],
)
def test_bad_input_is_a_422_with_the_command_lines_message(server, fields, cli_args, tmp_path):
    response = _client(server).post("/v1/videos", json={"prompt": "x", **fields})
    assert response.status_code == 422
    assert response.json()["error"] == _cli_error(cli_args, tmp_path)


def test_sampling_fields_for_a_causal_model_are_the_command_lines_error(server, tmp_path):
    response = _client(server).post(
        "/v1/videos", json={"prompt": "x", "model": "tiny-causal", "steps": 4, "accel": "dvg"}
    )
    assert response.status_code == 422
    message = response.json()["error"]
    assert message.startswith("--accel, --steps do not apply to the causal model 'tiny-causal'")
    # The command line says the same, then names its --set (which the server does not take).
    cli_message = _cli_error(["--model", "tiny-causal", "--steps", "4", "--accel", "dvg"], tmp_path)
    assert cli_message.startswith(message)


@pytest.mark.parametrize(
    "body, status, message",
    [
        (
            {"prompt": "x", "frames": 129, "height": 256, "width": 256},
            422,
            "129 frames of 256x256 are 8454144 pixels, over this server's --max-pixels 4194304",
        ),
        ({"frames": 9}, 422, "give --prompt"),
        ({"prompt": "x", "size": "64x64"}, 422, "unknown field 'size'; fields: prompt, model"),
        ({"prompt": "x", "frames": "9"}, 422, "frames must be an integer, got '9'"),
        ({"prompt": "x", "seed": True}, 422, "seed must be an integer, got True"),
        ({"prompt": "x", "budget": "high"}, 422, "budget must be a number, got 'high'"),
        (["x"], 422, "the request body must be a JSON object"),
    ],
)
def test_requests_the_command_line_cannot_make_are_rejected_in_one_line(
    server, body, status, message
):
    response = _client(server).post("/v1/videos", json=body)
    assert response.status_code == status
    assert response.json()["error"].startswith(message)


def test_a_body_that_is_not_json_is_a_400(server):
    response = _client(server).post("/v1/videos", content=b"{prompt")
    assert response.status_code == 400
    assert response.json()["error"].startswith("the request body is not JSON")


def test_unknown_or_unfinished_videos(server):
    client = _client(server)
    assert client.get("/v1/videos/v999").status_code == 404
    assert client.get("/v1/videos/v999/content").status_code == 404
    assert client.get("/v1/videos/v999/events").status_code == 404


def test_beyond_the_queue_limit_is_a_429_and_the_queue_recovers(tmp_path):
    release = threading.Event()

    def run(job, report):  # holds the worker until released
        report("denoising", 0.5)
        assert release.wait(30)
        job.path.write_bytes(b"mp4")

    app = create_app(max_queue=2, run=run, workdir=tmp_path)
    with TestClient(app) as client:
        body = {"prompt": "x", **TINY}
        ids = [client.post("/v1/videos", json=body).json()["id"] for _ in range(2)]
        full = client.post("/v1/videos", json=body)
        assert full.status_code == 429
        assert "(--max-queue 2)" in full.json()["error"]
        assert full.headers["retry-after"] == "5"
        assert client.get(f"/v1/videos/{ids[0]}/content").status_code == 409  # not done yet
        release.set()
        assert [_wait(client, i)["status"] for i in ids] == ["done", "done"]
        assert client.post("/v1/videos", json=body).status_code == 202


def test_finished_videos_beyond_max_jobs_are_deleted_oldest_first(tmp_path):
    def run(job, report):
        job.path.write_bytes(b"mp4")

    app = create_app(max_jobs=2, run=run, workdir=tmp_path)
    with TestClient(app) as client:
        ids = []
        for _ in range(3):
            ids.append(client.post("/v1/videos", json={"prompt": "x", **TINY}).json()["id"])
            _wait(client, ids[-1])
        assert client.get(f"/v1/videos/{ids[0]}").status_code == 404
        assert not (tmp_path / f"{ids[0]}.mp4").exists()
        assert [client.get(f"/v1/videos/{i}/content").content for i in ids[1:]] == [b"mp4"] * 2


def test_a_job_that_raises_fails_alone(tmp_path):
    def run(job, report):
        if job.request.seed == 1:
            raise RuntimeError("boom")
        job.path.write_bytes(b"mp4")

    app = create_app(run=run, workdir=tmp_path)
    with TestClient(app) as client:
        ids = [
            client.post("/v1/videos", json={"prompt": "x", "seed": s}).json()["id"]
            for s in range(3)
        ]
        videos = [_wait(client, i) for i in ids]
        assert [v["status"] for v in videos] == ["done", "failed", "done"]
        assert videos[1]["error"] == "RuntimeError: boom"
        assert client.get(f"/v1/videos/{ids[1]}/content").status_code == 409


def test_concurrent_submissions_all_complete_in_submission_order(server, tmp_path):
    client = _client(server)
    requests = [{**TINY, "seed": s} for s in range(6)] + [{**CAUSAL, "seed": s} for s in range(2)]
    with ThreadPoolExecutor(len(requests)) as pool:
        ids = list(pool.map(lambda r: _submit(client, **r), requests))
    assert len(set(ids)) == len(requests)
    videos = [_wait(client, i, timeout=180) for i in ids]
    assert [v["status"] for v in videos] == ["done"] * len(requests)
    assert sorted((v["settings"]["model"], v["settings"]["seed"]) for v in videos) == sorted(
        (r["model"], r["seed"]) for r in requests
    )
    for model, frames in (("tiny", 9), ("tiny-causal", 21)):
        # Ids are handed out in submission order; each model's worker runs one job at a time.
        mine = sorted((v for v in videos if v["settings"]["model"] == model), key=_number)
        for before, after in itertools.pairwise(mine):
            assert after["started"] >= before["finished"], (before, after)
        assert all(_frames(client, v["id"], tmp_path).shape[0] == frames for v in mine)


def _number(video: dict) -> int:
    return int(video["id"][1:])


def test_causal_chunks_stream_before_the_video_is_done_and_compile_once(server):
    client = _client(server)
    _wait(client, _submit(client, **CAUSAL, seed=11))  # compiled (if no test did yet)
    traced = TRACE_COUNT["sample_chunk"]
    job_id = _submit(client, **CAUSAL, seed=12)
    events = [e for _, e in _events(client, job_id)]
    assert TRACE_COUNT["sample_chunk"] == traced  # a second stream compiles nothing
    chunks = [e for e in events if e["type"] == "chunk"]
    assert [c["index"] for c in chunks] == [0, 1]
    assert [len(c["frames"]) for c in chunks] == [9, 12]  # 1 + 4*2 frames, then 4*3
    assert chunks[0]["progress"] < 1 and events.index(chunks[0]) < len(events) - 2
    png = chunks[0]["frames"][0]
    assert png.startswith("data:image/png;base64,")
    frame = iio.imread(base64.b64decode(png.split(",", 1)[1]), extension=".png")
    assert frame.shape == (64, 64, 3) and frame.std() > 0
    video = client.get(f"/v1/videos/{job_id}").json()
    assert 0 < video["timings"]["first_chunk_seconds"] < video["timings"]["total_seconds"]


def test_a_client_that_disconnects_mid_stream_breaks_nothing(server, tmp_path):
    client = _client(server)
    leaving = _submit(client, **CAUSAL, seed=21)
    seen = _events(client, leaving, stop_after="running")  # then the connection closes
    assert seen[-1][1]["type"] == "running"
    other = _submit(client, **TINY, seed=22)
    staying = [e for _, e in _events(client, leaving)]  # a second follower sees it all
    assert [e["type"] for e in staying][-1] == "done"
    assert sum(e["type"] == "chunk" for e in staying) == 2
    assert _wait(client, other)["status"] == "done"
    assert _frames(client, leaving, tmp_path).shape[0] == 21
    job = server.app.state.jobs.get(leaving)
    deadline = time.monotonic() + 10
    while job._watchers and time.monotonic() < deadline:  # the server noticed both left
        time.sleep(0.05)
    assert not job._watchers


def test_the_server_listens_only_on_the_host_it_was_given(server):
    assert server.host == "127.0.0.1"
    assert [s.getsockname()[0] for s in server.server.servers[0].sockets] == ["127.0.0.1"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nope"], "--model 'nope' is not a model this server can run"),
        (["--max-jobs", "0"], "--max-jobs must be >= 1, got 0"),
        (["--max-queue", "0"], "--max-queue must be >= 1, got 0"),
        (["--max-pixels", "0"], "--max-pixels must be >= 1, got 0"),
        (["--port", "70000"], "--port must be in 1..65535, got 70000"),
    ],
)
def test_serve_options_are_checked_before_listening(args, message):
    result = runner.invoke(cli, ["serve", *args])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and message in line
