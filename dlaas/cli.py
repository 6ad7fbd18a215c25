"""The `dlaas` command line: a thin layer over `dlaas.Client`.

Tables and colour for people; `--json` prints one JSON document on stdout for scripts
(progress bars and followed logs then go to stderr). Every failure exits non-zero with the
API's message and the offending fields on stderr, never a traceback; with `--json` the
problem document is also printed on stdout.

The API and key come from `--url` / `--api-key`, else DLAAS_URL / DLAAS_API_KEY, else the
client configuration `dlaas up` writes (see dlaas.config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand
from typer.models import CommandFunctionType

from dlaas.client import Client, ProgressCallback
from dlaas.config import dlaas_home
from dlaas.errors import ApiError, ConnectionFailed, DlaasError
from dlaas.models import ApiKey, Tenant, Training
from dlaas.tensorboard import (
    LogDirMirror,
    interruptible,
    start_tensorboard,
    stop_tensorboard,
    wait_until_serving,
)

# soft_wrap: long messages stay on one line (greppable), tables still fit the width.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {
    "COMPLETED": "bold green",
    "READY": "bold green",
    "FAILED": "bold red",
    "HALTED": "bold yellow",
    "STOPPED": "green",
    "RUNNING": "bold cyan",
    "STORING": "cyan",
    "DOWNLOADING": "cyan",
    "DEPLOYING": "cyan",
    "PENDING": "blue",
    "QUEUED": "blue",
}


@dataclasses.dataclass
class _Session:
    """One invocation's options, kept in the typer context (`ctx.obj`): the connection the
    app callback reads, and whether the command prints JSON, which the error handler needs
    to know about the command that failed."""

    url: str | None = None
    api_key: str | None = None
    json: bool = False


def _session(ctx: typer.Context) -> _Session:
    return ctx.ensure_object(_Session)


def _report(error: BaseException, session: _Session) -> NoReturn:
    """Print a failure for people (stderr) and, with --json, for scripts (stdout); exit 1."""
    if isinstance(error, ApiError):
        if session.json:
            _emit(error.problem)
        head = f"{error.title} (HTTP {error.status})"
        if error.errors:
            err.print(f"[bold red]error:[/] {escape(head)}")
            for field in error.errors:
                err.print(f"  [bold]{escape(field.field)}[/]: {escape(field.message)}")
        else:
            err.print(f"[bold red]error:[/] {escape(head)}: {escape(error.detail)}")
    else:
        message = error.message if isinstance(error, DlaasError) else str(error)
        if session.json:
            _emit({"title": type(error).__name__, "detail": message})
        err.print(f"[bold red]error:[/] {escape(message)}")
    raise SystemExit(1)


class _Command(TyperCommand):
    """A command whose usage line names its arguments as they are typed: `ID`, `[DEST]`
    (Typer writes a required one as `{ID}`, which reads like a placeholder to fill in)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not isinstance(param, TyperArgument):
                continue  # options are summed up by [OPTIONS]
            name = param.metavar or (param.name or "").upper()
            if not param.required and not name.startswith("["):
                name = f"[{name}]"
            if param.nargs != 1 and not name.endswith("..."):
                name += "..."
            pieces.append(name)
        return pieces


class _App(typer.Typer):
    """A Typer app whose expected failures end in a message and exit code 1."""

    def command(
        self, *args: Any, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The session outlives the command's context, for the error handler to read.
        session = _Session()
        try:
            return super().__call__(*args, obj=session, **kwargs)
        except (DlaasError, OSError, tarfile.TarError) as e:
            if isinstance(e, BrokenPipeError):  # `dlaas logs ... | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(0) from None
            _report(e, session)


app = _App(
    name="dlaas",
    help="Distributed deep-learning training as a service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
deployments_app = _App(help="Online deployments of trained models.", no_args_is_help=True)
tenants_app = _App(help="Tenants and their API keys (admin key).", no_args_is_help=True)
runtimes_app = _App(
    help="The framework runtimes of this machine's platform (as `dlaas up`, on DLAAS_HOME).",
    no_args_is_help=True,
)
keys_app = _App(
    help="A tenant's API keys: the admin key for any tenant, a tenant's own key for its own.",
    no_args_is_help=True,
)
app.add_typer(deployments_app, name="deployments")
app.add_typer(tenants_app, name="tenants")
app.add_typer(runtimes_app, name="runtimes")
tenants_app.add_typer(keys_app, name="keys")

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout (for scripts).")
]


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option(help="The API (default DLAAS_URL, then the client config).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Your key (default DLAAS_API_KEY, then the client config).")
    ] = None,
) -> None:
    """Distributed deep-learning training as a service."""
    session = _session(ctx)
    session.url = url
    session.api_key = api_key


def _client(ctx: typer.Context, api_key: str | None = None) -> Client:
    session = _session(ctx)
    return Client(session.url, api_key or session.api_key)


# -- output helpers ------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'bold')}]{status}[/]"


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago, in at most four characters (`45s`, `12m`, `5h`, `3d`, `412d`): a list
    keeps one line per row on an 80-column terminal. `show` prints the full time."""
    if value is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        # Two units' worth before switching: `90m` says more than `1h`.
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cut(text: str) -> Text:
    """A cell that stays on one line, cut with an ellipsis when the table needs its room."""
    return Text(text, no_wrap=True, overflow="ellipsis")


def _listing(*columns: str) -> Table:
    """A list's table: the NAME column gives up its width first, the others are never cut."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        if column == "NAME":
            table.add_column(column, min_width=4, ratio=1)
        else:
            table.add_column(column, no_wrap=True, justify="right" if column == "AGE" else "left")
    return table


@contextmanager
def _transfer(description: str) -> Iterator[ProgressCallback]:
    """A progress bar on stderr (shown on a terminal only) fed by the client's callback."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def _spinner(message: str) -> Any:
    return err.status(message) if err.is_terminal else nullcontext()


def _show_training(training: Training) -> None:
    out.print(
        f"[bold]Training {escape(training.id)}[/]  {escape(training.name)}"
        + (f"  [dim]{escape(training.description)}[/]" if training.description else "")
    )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    status = _status(training.status)
    if training.status_message:
        status += f"  {escape(training.status_message)}"
    grid.add_row("status", status)
    if training.limits_note:
        grid.add_row("limits", escape(training.limits_note))
    if training.attempt > 1 or training.past_attempts:
        grid.add_row("attempt", str(training.attempt))
    grid.add_row("framework", escape(f"{training.framework.name} {training.framework.version}"))
    compute = training.compute_configuration
    grid.add_row("compute", escape(f"{compute.name} x {compute.nodes}"))
    grid.add_row("created", _when(training.created_at))
    grid.add_row("started", _when(training.started_at))
    grid.add_row("completed", _when(training.completed_at))
    out.print(grid)
    if training.learners:
        learners = Table(title="Learners", title_justify="left", box=None)
        learners.add_column("learner", justify="right")
        learners.add_column("status")
        learners.add_column("exit code", justify="right")
        for lr in training.learners:
            learners.add_row(
                str(lr.learner_id),
                _learner_status(lr.status, lr.status_message),
                _exit_code(lr.exit_code),
            )
        out.print(learners)
    for past in training.past_attempts:
        table = Table(
            title=f"Attempt {past.attempt} (ended {_when(past.ended_at)})",
            title_justify="left",
            caption=escape(past.message),
            caption_justify="left",
            box=None,
        )
        table.add_column("learner", justify="right")
        table.add_column("status")
        table.add_column("exit code", justify="right")
        table.add_column("message")
        for plr in past.learners:
            table.add_row(
                str(plr.learner_id),
                _status(plr.status),
                _exit_code(plr.exit_code),
                escape(plr.status_message or ""),
            )
        out.print(table)
    if training.status_history:
        retried = training.attempt > 1
        history = Table(title="History", title_justify="left", box=None)
        history.add_column("time")
        if retried:
            history.add_column("attempt", justify="right")
        history.add_column("status")
        history.add_column("message")
        for event in training.status_history:
            cells = [_when(event.at), _status(event.status), escape(event.message or "")]
            if retried:
                cells.insert(1, str(event.attempt))
            history.add_row(*cells)
        out.print(history)


def _learner_status(status: str, message: str | None) -> str:
    """A learner's status and why (`STOPPED: the workers completed`)."""
    return _status(status) + (f": {escape(message)}" if message else "")


def _next_steps(training: Training) -> list[str]:
    """What to do with a training that has ended, as the commands to type."""
    tid = training.id
    if training.succeeded:
        return [
            f"Deploy its model:   dlaas deploy {tid}",
            f"Download results:   dlaas download {tid}",
            f"Details, metrics:   dlaas show {tid}; dlaas metrics {tid}",
        ]
    return [f"See why:            dlaas show {tid}; dlaas logs {tid}"]


def _until_started(
    client: Client,
    training_id: str,
    *,
    every: float = 1.0,
    quiet_for: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """While the training waits to start (QUEUED, PENDING: admission, a runtime installed
    on its first use), say on stderr what it waits for: each new message, and the same one
    again at most every `quiet_for` seconds (an install's progress changes every poll)."""
    said, said_at = "", -quiet_for
    while True:
        training = client.trainings.get(training_id)
        if training.status not in ("QUEUED", "PENDING"):
            return
        message = f"{training.status}  {training.status_message or ''}".rstrip()
        news = _ELAPSED.sub("", message) != _ELAPSED.sub("", said)
        if message != said and (news or clock() - said_at >= quiet_for):
            err.print(escape(message))
            said, said_at = message, clock()
        sleep(every)


# The elapsed time in an install's progress (`... on its first use (1m05s): ...`).
_ELAPSED = re.compile(r" \(\d+m\d+s\)")


def _follow(client: Client, training_id: str, *, json_: bool) -> None:
    """Print the training's log lines as they come, until it has ended (stdout, or stderr
    under --json so stdout keeps one document)."""
    stream = sys.stderr if json_ else sys.stdout
    with client.trainings.logs(training_id, follow=True) as lines:
        for line in lines:
            stream.write(line + "\n")
            stream.flush()


# -- trainings -----------------------------------------------------------------------------


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    install_runtimes: Annotated[
        bool,
        typer.Option(
            "--install-runtimes",
            help="Start building every framework runtime (Horovod, DDL) in the background "
            "at start-up, before a training needs one.",
        ),
    ] = False,
) -> None:
    """Run the platform on this machine: the API, a worker and the monitor (SQLite, a local
    object store and local learners unless DLAAS_* settings say otherwise). A training whose
    runtime is not installed yet installs it on its first use. Ctrl-C stops it; the next
    `dlaas up` resumes."""
    # Lazy: the client and the other commands must not need the server's dependencies.
    from composition import EmbeddedError, serve

    try:
        serve(host, port, echo=typer.echo, install_runtimes=install_runtimes)
    except EmbeddedError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        raise SystemExit(1) from None


@runtimes_app.command("list")
def runtimes_list(json_: JsonFlag = False) -> None:
    """Each runtime: the framework versions it serves, whether it is installed, and what it
    provides (TensorFlow, Horovod and its build, MPI)."""
    from composition.runtimes import listing

    found = listing()
    if json_:
        _emit(found)
        return
    table = Table(box=None, header_style="bold")
    for column in ("RUNTIME", "SERVES", "INSTALLED", "PROVIDES"):
        table.add_column(column)
    for r in found:
        serves = ", ".join(f"{s['framework']} {s['version']}" for s in r["serves"]) or "-"
        provides = ", ".join(
            f"{k} {v}"
            for k, v in r["provides"].items()
            if k in ("tensorflow", "horovod", "mpi") and isinstance(v, str)
        )
        table.add_row(
            escape(r["name"]),
            escape(serves),
            "yes" if r["installed"] else "no",
            escape(provides or "-"),
        )
    out.print(table)


@runtimes_app.command("install")
def runtimes_install(
    names: Annotated[
        list[str] | None, typer.Argument(metavar="[NAME]...", help="Default: every runtime.")
    ] = None,
) -> None:
    """Build runtimes on this machine (cached: an installed one is left as it is)."""
    from composition.runtimes import RuntimeBuildError, install

    try:
        install(names or [], progress=lambda line: err.print(escape(line)))
    except RuntimeBuildError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        raise SystemExit(1) from None


@app.command()
def train(
    ctx: typer.Context,
    manifest: Annotated[
        Path,
        typer.Argument(
            metavar="MANIFEST",
            help="The manifest (YAML or JSON), or a Kubeflow TFJob or MPIJob file.",
            exists=True,
            dir_okay=False,
        ),
    ],
    code: Annotated[
        Path,
        typer.Argument(
            metavar="CODE", help="The code: a directory, or a .zip / .tar.gz.", exists=True
        ),
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream the logs until the training ends.")
    ] = False,
    json_: JsonFlag = False,
) -> None:
    """Submit a training. With --follow, stream its logs and exit non-zero unless it
    completes."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        with _transfer(f"uploading {code.name}") as progress:
            training = client.trainings.create(manifest, code, progress=progress)
        if not json_:
            out.print(
                f"Training [bold]{escape(training.id)}[/] ({escape(training.name)}) "
                f"submitted: {_status(training.status)}"
            )
        if not follow:
            if json_:
                _emit(training.raw)
            else:
                out.print(f"Follow it with: dlaas logs {training.id} --follow")
            return
        _until_started(client, training.id)
        _follow(client, training.id, json_=json_)
        final = client.trainings.wait(training.id, poll_interval=0.5)
    if json_:
        _emit(final.raw)
    else:
        message = f"  {escape(final.status_message)}" if final.status_message else ""
        out.print(f"Training {escape(final.id)} {_status(final.status)}{message}")
        for step in _next_steps(final):
            out.print(escape(step))
    if not final.succeeded:
        raise SystemExit(1)


@app.command("list")
def list_(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only trainings in this state.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    cursor: Annotated[
        str | None,
        typer.Option(help="Go on from the next_cursor of an earlier --json answer."),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Your trainings, newest first. With --json, the API's answer: items and next_cursor
    (null once every training is listed; else pass it to --cursor)."""
    _session(ctx).json = json_
    items: list[dict[str, Any]] = []
    trainings: list[Training] = []
    with _client(ctx) as client:
        while limit is None or len(trainings) < limit:
            size = 100 if limit is None else min(100, limit - len(trainings))
            page = client.trainings.page(status=status, limit=size, cursor=cursor)
            items.extend(page.raw["items"])
            trainings.extend(page.items)
            cursor = page.next_cursor
            if not cursor:
                break
    if json_:
        _emit({"items": items, "next_cursor": cursor})
        return
    if not trainings:
        out.print("No trainings yet. Submit one with: dlaas train MANIFEST CODE")
        return
    table = _listing("ID", "NAME", "STATUS", "FRAMEWORK", "NODES", "AGE")
    now = datetime.now(UTC)
    for t in trainings:
        table.add_row(
            escape(t.id),
            _cut(t.name),
            _status(t.status),
            escape(f"{t.framework.name} {t.framework.version}"),
            str(t.compute_configuration.nodes),
            _age(t.created_at, now),
        )
    out.print(table)


def _exit_code(code: int | None) -> str:
    """A learner's exit code as `dlaas show` prints it; a negative one is the signal that
    ended it (a learner the platform stopped: `-15 (SIGTERM)`)."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"{code} (signal {-code})"
    return str(code)


@app.command()
def show(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """A training's status, learners and history."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        training = client.trainings.get(training_id)
    if json_:
        _emit(training.raw)
    else:
        _show_training(training)


@app.command()
def logs(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep streaming until the training ends.")
    ] = False,
    learner: Annotated[int | None, typer.Option(min=1, help="Only this learner (1..N).")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only lines from this time on (ISO 8601 or epoch s).")
    ] = None,
) -> None:
    """A training's logs: `<time> [learner <i>] <line>` for every learner's output."""
    with (
        _client(ctx) as client,
        client.trainings.logs(training_id, follow=follow, learner=learner, since=since) as lines,
    ):
        for line in lines:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


@app.command()
def metrics(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """The evaluation metrics of a training (the manifest's evaluation_metrics): read
    from its logs, or the scalars of its TensorBoard event files."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        found = client.trainings.metrics(training_id)
    if json_:
        _emit({name: [dataclasses.asdict(p) for p in points] for name, points in found.items()})
        return
    if not found:
        out.print(
            "No metrics: this training's manifest defines no evaluation_metrics, or its "
            "learners have written no TensorBoard scalars yet."
        )
        return
    table = Table(box=None, header_style="bold")
    for column in ("METRIC", "LEARNER", "STEP", "VALUE", "TIME"):
        table.add_column(column, justify="right" if column in ("STEP", "VALUE") else "left")
    for name, points in found.items():
        if not points:
            table.add_row(escape(name), "-", "-", "[dim]no values yet[/]", "-")
        for p in points:
            step = "-" if p.step is None else str(p.step)
            table.add_row(escape(name), str(p.learner), step, f"{p.value:.6g}", _when(p.timestamp))
    out.print(table)


@app.command()
def stop(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """Stop a training (its learners get SIGTERM, then SIGKILL)."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        training = client.trainings.stop(training_id)
    if json_:
        _emit(training.raw)
    elif training.status == "HALTED":
        out.print(f"Training {escape(training.id)} {_status('HALTED')}")
    else:
        out.print(f"Stopping training {escape(training.id)}: its learners are being stopped")


@app.command()
def delete(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """Delete a training with its code, results and logs (stopping it first)."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        client.trainings.delete(training_id)
    if json_:
        _emit({"id": training_id, "deleted": True})
    else:
        out.print(f"Deleted training {escape(training_id)}")


@app.command()
def tensorboard(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    logdir: Annotated[
        Path | None,
        typer.Option(
            "--logdir",
            help="Where the training's LOG_DIR files go, learner-<i>/ each (default: a "
            "temporary directory, removed at the end).",
            file_okay=False,
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="TensorBoard's port.", min=1)] = 6006,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between two syncs.", min=0.5)
    ] = 5.0,
) -> None:
    """TensorBoard on a training's LOG_DIR: every learner's files (learner-<i>/ as run
    names), kept in sync while the training runs. Needs TensorBoard (installed with dlaas).
    Ctrl-C (or SIGTERM) stops it and the TensorBoard it started."""
    with interruptible(), contextlib.ExitStack() as stack:
        try:
            _serve_tensorboard(stack, _client(ctx), training_id, logdir, port, interval)
        except KeyboardInterrupt:
            return


def _serve_tensorboard(
    stack: contextlib.ExitStack,
    client: Client,
    training_id: str,
    logdir: Path | None,
    port: int,
    interval: float,
) -> None:
    """`dlaas tensorboard`'s work, until TensorBoard exits or Ctrl-C; `stack` stops
    TensorBoard and removes a temporary directory however it ends."""
    stack.enter_context(client)
    training = client.trainings.get(training_id)
    if logdir is None:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dlaas-tb-")))
    else:
        root = logdir
        root.mkdir(parents=True, exist_ok=True)
    mirror = LogDirMirror(client, training.id, root)
    mirror.sync()
    proc = start_tensorboard(root, port)
    stack.callback(stop_tensorboard, proc)
    url = f"http://127.0.0.1:{port}/"
    wait_until_serving(proc, url)
    out.print(f"TensorBoard for training {escape(training.id)} at {url} (Ctrl-C stops it)")
    syncing, failed = not training.terminal, False
    while proc.poll() is None:
        time.sleep(interval)
        if not syncing:
            continue
        try:
            ended = client.trainings.get(training.id).terminal
            mirror.sync()  # after the check: what an ended training stored last is here
            failed = False
        except ConnectionFailed as e:
            if not failed:
                err.print(f"syncing failed, trying again: {escape(str(e))}")
            failed = True
            continue
        if ended:
            syncing = False
            out.print(f"Training {escape(training.id)} has ended; all its LOG_DIR files are here.")
    raise DlaasError(f"TensorBoard exited with code {proc.returncode}")


@app.command()
def download(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="ID")],
    dest: Annotated[
        Path | None,
        typer.Argument(
            metavar="DEST",
            help="Directory to write the results into (default ./ID).",
            file_okay=False,
        ),
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Download a training's results (the model, files it wrote, every learner's log)."""
    _session(ctx).json = json_
    target = dest if dest is not None else Path(training_id)
    with _client(ctx) as client, _transfer(f"downloading {training_id}") as progress:
        files = client.trainings.download(training_id, target, progress=progress)
    root = target.resolve()
    relative = [str(f.relative_to(root)) for f in files]
    if json_:
        _emit({"training_id": training_id, "dest": str(root), "files": relative})
        return
    out.print(f"Downloaded {len(files)} file(s) to [bold]{escape(str(target))}[/]")
    for name in relative[:20]:
        out.print(f"  {escape(name)}")
    if len(relative) > 20:
        out.print(f"  ... and {len(relative) - 20} more")


@app.command()
def usage(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """Your use against your plan's limits."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        found = client.usage()
    if json_:
        _emit(found.raw)
        return
    out.print(f"Plan: [bold]{escape(found.plan)}[/]")
    table = Table(box=None, header_style="bold")
    for column in ("LIMIT", "USED", "ALLOWED"):
        table.add_column(column)
    rows = [
        ("queued trainings", found.queued_trainings),
        ("active trainings", found.active_trainings),
        ("active learners", found.active_nodes),
        ("deployments", found.deployments),
        ("stored bytes", found.stored_bytes),
    ]
    for label, use in rows:
        if use is None:
            continue
        style = "red" if use.used >= use.limit else ""
        table.add_row(label, f"[{style}]{use.used}[/]" if style else str(use.used), str(use.limit))
    table.add_row("max_runtime default (s)", "", str(found.default_max_runtime))
    table.add_row("max_runtime maximum (s)", "", str(found.max_max_runtime))
    out.print(table)


# -- tenants (admin) -----------------------------------------------------------------------

AdminKey = Annotated[
    str | None,
    typer.Option(
        help="The admin key (default DLAAS_ADMIN_API_KEY, then $DLAAS_HOME/admin_api_key)."
    ),
]


def _found_admin_key() -> str | None:
    """DLAAS_ADMIN_API_KEY, else the key in $DLAAS_HOME/admin_api_key, else None."""
    if env := os.environ.get("DLAAS_ADMIN_API_KEY"):
        return env
    try:
        return (dlaas_home() / "admin_api_key").read_text().strip() or None
    except OSError:
        return None


def _admin_key(explicit: str | None) -> str:
    if explicit:
        return explicit
    if found := _found_admin_key():
        return found
    raise DlaasError(
        f"no admin key: pass --admin-key, set DLAAS_ADMIN_API_KEY, or run this where "
        f"`dlaas up` keeps {dlaas_home() / 'admin_api_key'}"
    )


def _keys_client(ctx: typer.Context, admin_key: str | None) -> Client:
    """For `tenants keys`: --admin-key, else --api-key, else the admin key if one is found
    (DLAAS_ADMIN_API_KEY, $DLAAS_HOME/admin_api_key), else your own key (DLAAS_API_KEY,
    the client configuration), which manages its own tenant's keys."""
    if admin_key or _session(ctx).api_key:
        return _client(ctx, api_key=admin_key)
    return _client(ctx, api_key=_found_admin_key())


def _tenants_table(tenants: Sequence[Tenant]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "PLAN", "CREATED"):
        table.add_column(column)
    for t in tenants:
        table.add_row(escape(t.id), escape(t.name), escape(t.plan), _when(t.created_at))
    return table


@tenants_app.command("create")
def tenants_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    plan: Annotated[str, typer.Option(help="Its plan: lite or standard by default.")],
    admin_key: AdminKey = None,
    json_: JsonFlag = False,
) -> None:
    """Create a tenant; prints its API key, shown this once."""
    _session(ctx).json = json_
    with _client(ctx, api_key=_admin_key(admin_key)) as client:
        tenant = client.tenants.create(name, plan)
    if json_:
        _emit(tenant.raw)
        return
    out.print(f"Tenant [bold]{escape(tenant.name)}[/] created on the {escape(tenant.plan)} plan.")
    out.print("Its API key (shown once, keep it):")
    out.print(f"  export DLAAS_API_KEY={tenant.api_key}", soft_wrap=True)


@tenants_app.command("list")
def tenants_list(ctx: typer.Context, admin_key: AdminKey = None, json_: JsonFlag = False) -> None:
    """Every tenant."""
    _session(ctx).json = json_
    with _client(ctx, api_key=_admin_key(admin_key)) as client:
        tenants = client.tenants.list()
    if json_:
        _emit({"items": [t.raw for t in tenants]})
    else:
        out.print(_tenants_table(tenants))


KeysAdminKey = Annotated[
    str | None,
    typer.Option(
        help="The admin key; default --api-key, then DLAAS_ADMIN_API_KEY or "
        "$DLAAS_HOME/admin_api_key, then your own key (for your own tenant)."
    ),
]
TenantId = Annotated[str, typer.Argument(metavar="TENANT_ID", help="The tenant's id.")]


def _keys_table(keys: Sequence[ApiKey]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "PREFIX", "CREATED", "LAST USED", "REVOKED"):
        table.add_column(column, no_wrap=True)
    for k in keys:
        revoked = "[bold red]" + _when(k.revoked) + "[/]" if k.revoked else "-"
        table.add_row(escape(k.id), escape(k.prefix), _when(k.created), _when(k.last_used), revoked)
    return table


@keys_app.command("list")
def keys_list(
    ctx: typer.Context,
    tenant_id: TenantId,
    admin_key: KeysAdminKey = None,
    json_: JsonFlag = False,
) -> None:
    """The tenant's API keys, revoked ones too (their ids and first characters only)."""
    _session(ctx).json = json_
    with _keys_client(ctx, admin_key) as client:
        keys = client.tenants.list_keys(tenant_id)
    if json_:
        _emit({"items": [k.raw for k in keys]})
    else:
        out.print(_keys_table(keys))


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    tenant_id: TenantId,
    admin_key: KeysAdminKey = None,
    json_: JsonFlag = False,
) -> None:
    """Issue another API key for the tenant; prints it, shown this once. Its other keys
    stay valid: switch to the new one, then revoke the old one."""
    _session(ctx).json = json_
    with _keys_client(ctx, admin_key) as client:
        key = client.tenants.create_key(tenant_id)
    if json_:
        _emit(key.raw)
        return
    out.print(f"API key [bold]{escape(key.id)}[/] created for tenant {escape(tenant_id)}.")
    out.print("The key (shown once, keep it):")
    out.print(f"  export DLAAS_API_KEY={key.api_key}", soft_wrap=True)


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context,
    tenant_id: TenantId,
    key_id: Annotated[str, typer.Argument(metavar="KEY_ID", help="The key's id (keys list).")],
    admin_key: KeysAdminKey = None,
    json_: JsonFlag = False,
) -> None:
    """Revoke one of the tenant's API keys: refused everywhere within a second."""
    _session(ctx).json = json_
    with _keys_client(ctx, admin_key) as client:
        client.tenants.revoke_key(tenant_id, key_id)
    if json_:
        _emit({"id": key_id, "tenant_id": tenant_id, "revoked": True})
    else:
        out.print(f"Revoked API key {escape(key_id)} of tenant {escape(tenant_id)}")


# The deployments' commands register themselves on `app` and `deployments_app`.
from dlaas import cli_deployments  # noqa: E402, F401

if __name__ == "__main__":  # python -m dlaas.cli: the module as imported holds every command
    from dlaas.cli import app as registered

    registered()
