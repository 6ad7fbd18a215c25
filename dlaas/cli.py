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
    """Run the platform on this machine (SQLite and a local object store by default)."""
    # Lazy: the client and the other commands must not need the server's dependencies.
    import uvicorn

    from service.api.app import create_app
    from service.platform import Platform
    from service.settings import Settings

    settings = Settings()
    platform = Platform.from_settings(settings)
    platform.migrate()
    where = "DLAAS_ADMIN_API_KEY" if settings.admin_api_key else str(settings.admin_key_file)
    typer.echo(f"DLaaS API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    typer.echo(f"home: {settings.home_dir}   admin API key: {where}")
    uvicorn.run(create_app(platform=platform), host=host, port=port, log_level="info")


if __name__ == "__main__":
    app()
