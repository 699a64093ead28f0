"""`vidax serve`: the web app and HTTP API on one host and port (uvicorn)."""

from __future__ import annotations

from typing import Annotated

import typer

from vidax.errors import require_extra
from vidax.serve.requests import DEFAULT_MAX_PIXELS


def register(app: typer.Typer) -> None:
    """Adds the `serve` command to `app`."""

    @app.command("serve")
    def serve_command(
        model: Annotated[
            str, typer.Option(help="Default model (preselected on the page; see `vidax models`).")
        ] = "tiny",
        host: Annotated[
            str, typer.Option(help="Address to listen on (only this one; 0.0.0.0: every one).")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
        max_jobs: Annotated[
            int, typer.Option(help="Finished videos kept; beyond it the oldest are deleted.")
        ] = 100,
        max_queue: Annotated[
            int, typer.Option(help="Videos waiting or being made at once; more get HTTP 429.")
        ] = 16,
        max_pixels: Annotated[
            int, typer.Option(help="Largest video a request may ask for: frames x height x width.")
        ] = DEFAULT_MAX_PIXELS,
    ) -> None:
        """Serve a web page and an HTTP API that make videos and stream them as they are made."""
        require_extra("uvicorn", extra="serve", purpose="vidax serve")
        require_extra("starlette", extra="serve", purpose="vidax serve")
        # Imported here: they need the serve extra (uvicorn, starlette), checked just above, and
        # `vidax` imports this module at start-up for every command.
        import uvicorn

        from vidax.serve.app import create_app

        if not 0 < port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {port}")
        web = create_app(
            default_model=model, max_jobs=max_jobs, max_queue=max_queue, max_pixels=max_pixels
        )

        class Server(uvicorn.Server):
            async def shutdown(self, sockets=None) -> None:
                # Event streams stay open while a job runs: end them, or Ctrl-C waits on them.
                web.state.jobs.stop_following()
                await super().shutdown(sockets)

        typer.echo(f"vidax serve: http://{host}:{port}/ (Ctrl-C stops)", err=True)
        config = uvicorn.Config(
            web, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5
        )
        Server(config).run()
