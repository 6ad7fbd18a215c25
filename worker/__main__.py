"""`python -m worker`: a Celery worker for DLaaS tasks (one task at a time per process)."""

from __future__ import annotations

import sys

from worker.celery_app import create_celery_app


def main() -> None:
    create_celery_app().worker_main(
        [
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            *sys.argv[1:],
        ]
    )


if __name__ == "__main__":
    main()
