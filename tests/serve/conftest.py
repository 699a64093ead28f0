"""A real `vidax serve` app (uvicorn on 127.0.0.1, a free port) shared by the serve tests, so each
model is loaded and compiled once."""

import threading
import time

import pytest

# The small settings every test uses: one compiled sampler, one compiled causal stepper.
TINY = {"model": "tiny", "frames": 9, "height": 32, "width": 32, "steps": 2}
CAUSAL = {"model": "tiny-causal", "frames": 21, "height": 64, "width": 64}  # two chunks


class Server:
    """uvicorn serving `app` in a thread; `url` is its address."""

    def __init__(self, app, host: str = "127.0.0.1"):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        self.host, self.port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.app = app

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    pytest.importorskip("uvicorn")
    from vidax.serve import create_app

    srv = Server(create_app(max_jobs=50, max_queue=32, workdir=tmp_path_factory.mktemp("videos")))
    yield srv
    srv.stop()
