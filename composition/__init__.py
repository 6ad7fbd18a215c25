"""`dlaas up`: the whole platform from one command. The composition of the platform:
the one package that imports service, worker and the client's configuration together.

Roles: serving (this process's API, monitor and signals), supervisor (the Celery worker
child), bootstrap (the local tenant and the client configuration), backend (where learners
run, checked before it says it is up: with DLAAS_BACKEND=kubernetes, stores the pods reach
and a namespace the cluster lists), shutdown (halting what runs when it stops; on
Kubernetes, deleting the pods of running trainings), runtime_builds (runtimes installed on
their first use by default; `--install-runtimes` builds them all from start-up).

What runs where:
- this process: the API (uvicorn, in a thread), the monitor (a thread), and in the main
  thread a supervisor that handles signals and owns the worker;
- one Celery worker, `python -m worker`, as a child process (composition.supervisor says
  why and how it is supervised).
All of them read the same DLAAS_* settings, so the embedded platform takes the code paths of a
cluster: SQLite, the broker directory and the object-store directory under DLAAS_HOME by
default, or whatever DLAAS_DATABASE_URL, DLAAS_BROKER_URL and DLAAS_S3_* name.

On first start it creates a tenant named `local` (standard plan) and writes the client
configuration (`$DLAAS_HOME/client.json`, or `$DLAAS_CONFIG`; mode 0600) with the API's URL
and that tenant's key, so `dlaas train ...` and `dlaas.Client()` need no flags. Later starts
keep the key and update the URL.

Ctrl-C (SIGINT) or SIGTERM shut it down cleanly, in this order: the API stops taking
requests; the monitor stops; the worker stops (finishing a task it is running) while the
learners of every training that has some are stopped, and those trainings are recorded
HALTED with a message saying the platform was shut down (their logs are archived as for any
ended training). Nothing else is touched: the database, the object store, tenants, results,
deployments and the client configuration are kept.

What the next `dlaas up` resumes: QUEUED trainings start as capacity allows; a training
that was PENDING with no learner started yet is launched (the monitor re-sends launches it
does not see in the backend); trainings whose learners outlived an unclean end of `dlaas up`
(SIGKILL, a crash) are observed where they are and finish normally, or fail as lost if their
learners are gone too. A training halted by the shutdown is not re-run (states never go
back): submit it again.
"""

from __future__ import annotations

from composition.errors import EmbeddedError
from composition.serving import serve

__all__ = ["EmbeddedError", "serve"]
