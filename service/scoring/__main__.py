"""`python -m service.scoring [--host H] [--port P]`: the scoring service alone."""

from __future__ import annotations

import argparse

import uvicorn

from service.http.server import server_config
from service.scoring.app import create_scoring_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve predictions of deployed models.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    config = server_config(
        create_scoring_app(), host=args.host, port=args.port, log_level=args.log_level
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
