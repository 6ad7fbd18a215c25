"""The `dlaas` command line."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="dlaas",
    help="Distributed deep-learning training as a service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Distributed deep-learning training as a service."""


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
) -> None:
    """Run the platform on this machine: the API, a worker and the monitor (SQLite, a local
    object store and local learners unless DLAAS_* settings say otherwise)."""
    # Lazy: the client and the other commands must not need the server's dependencies.
    from service.embedded import serve

    serve(host, port, echo=typer.echo)


if __name__ == "__main__":
    app()
