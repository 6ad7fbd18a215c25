"""`dlaas deploy`, `dlaas predict` and `dlaas deployments ...`: deployments, their
versions and labels. Registered on the command line of dlaas.cli, whose helpers they use."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from dlaas.cli import (
    JsonFlag,
    _age,
    _App,
    _client,
    _cut,
    _emit,
    _listing,
    _session,
    _spinner,
    _status,
    _when,
    app,
    deployments_app,
    out,
)
from dlaas.models import Deployment, DeploymentVersion, Signature, Tensor

versions_app = _App(
    help="A deployment's versions: list, add from another training, unload.",
    no_args_is_help=True,
)
deployments_app.add_typer(versions_app, name="versions")


def _show_deployment(deployment: Deployment) -> None:
    message = f"  {escape(deployment.status_message)}" if deployment.status_message else ""
    name = f" ({escape(deployment.name)})" if deployment.name else ""
    out.print(
        f"Deployment [bold]{escape(deployment.id)}[/]{name} of training "
        f"{escape(deployment.training_id)}: {_status(deployment.status)}{message}"
    )


@app.command()
def deploy(
    ctx: typer.Context,
    training_id: Annotated[str, typer.Argument(metavar="TRAINING_ID")],
    name: Annotated[str | None, typer.Option(help="A name for the deployment.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait until it is READY (or FAILED).")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for READY.")] = 300.0,
    json_: JsonFlag = False,
) -> None:
    """Deploy a completed training's SavedModel for online scoring."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        deployment = client.deployments.create(training_id, name=name)
        if wait and not deployment.final:
            with _spinner(f"deploying {deployment.id}"):
                deployment = client.deployments.wait(deployment.id, timeout)
    if json_:
        _emit(deployment.raw)
    else:
        _show_deployment(deployment)
        if deployment.ready:
            out.print(f"Score with: dlaas predict {deployment.id} --input FILE")
    if deployment.status == "FAILED":
        raise SystemExit(1)


def _read_instances(source: str) -> list[Any]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
        document = json.loads(text)
    except ValueError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--input") from None
    if isinstance(document, dict) and isinstance(document.get("instances"), list):
        return list(document["instances"])
    if isinstance(document, list):
        return document
    raise typer.BadParameter(
        'expected {"instances": [...]} or a JSON list of instances', param_hint="--input"
    )


@app.command()
def predict(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="DEPLOYMENT_ID")],
    input_: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help='A JSON file: an object whose "instances" is the list of instances, or '
            "that list alone; - for stdin.",
        ),
    ],
    version: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The version to score with (default: the one the stable label points "
            "at, else the latest loaded).",
        ),
    ] = None,
    label: Annotated[
        str | None, typer.Option(help="A label (stable, canary, ...) naming the version.")
    ] = None,
    json_: JsonFlag = False,
) -> None:
    """Score instances with a deployed model; prints the predictions."""
    _session(ctx).json = json_
    instances = _read_instances(input_)
    with _client(ctx) as client:
        predictions = client.deployments.predict(
            deployment_id, instances, version=version, label=label
        )
    if json_:
        _emit({"predictions": predictions})
        return
    if isinstance(predictions, list) and len(predictions) == len(instances):
        table = Table(box=None, header_style="bold")
        table.add_column("INPUT")
        table.add_column("PREDICTION")
        for instance, prediction in zip(instances, predictions, strict=True):
            table.add_row(escape(json.dumps(instance)), escape(json.dumps(prediction)))
        out.print(table)
    else:
        out.print_json(data=predictions)


@deployments_app.command("list")
def deployments_list(ctx: typer.Context, json_: JsonFlag = False) -> None:
    """Your deployments."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        found = client.deployments.list()
    if json_:
        _emit({"items": [d.raw for d in found]})
        return
    if not found:
        out.print("No deployments. Deploy a completed training with: dlaas deploy TRAINING_ID")
        return
    table = _listing("ID", "NAME", "TRAINING", "STATUS", "AGE")
    now = datetime.now(UTC)
    for d in found:
        table.add_row(
            escape(d.id),
            _cut(d.name or ""),
            escape(d.training_id),
            _status(d.status),
            _age(d.created_at, now),
        )
    out.print(table)


@deployments_app.command("show")
def deployments_show(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """A deployment's status and, once READY, its signature: the inputs a prediction
    sends and the outputs it gets, with their dtypes and shapes."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        deployment = client.deployments.get(deployment_id)
    if json_:
        _emit(deployment.raw)
        return
    _show_deployment(deployment)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    grid.add_row("created", _when(deployment.created_at))
    grid.add_row("ready", _when(deployment.ready_at))
    if deployment.default_version is not None:
        grid.add_row("default version", str(deployment.default_version))
    out.print(grid)
    if len(deployment.versions) > 1 or deployment.labels:
        out.print(_versions_table(deployment.versions))
    if deployment.signature is not None:
        out.print(_signature_table("Signature serving_default", deployment.signature))
    others = sorted(name for name in deployment.signatures if name != "serving_default")
    if others:
        out.print(
            "Other signatures (a prediction names one with signature_name): "
            + escape(", ".join(others))
        )


def _shape(tensor: Tensor) -> str:
    """A tensor's shape as TensorFlow prints it: `(None, 2)`, None for any size."""
    if tensor.shape is None:
        return "unknown rank"
    dims = ["None" if d is None else str(d) for d in tensor.shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _signature_table(title: str, signature: Signature) -> Table:
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for column in ("", "NAME", "DTYPE", "SHAPE"):
        table.add_column(column, no_wrap=column != "NAME")
    for kind, tensors in (("input", signature.inputs), ("output", signature.outputs)):
        for t in tensors:
            table.add_row(kind, escape(t.name), escape(t.dtype), _shape(t))
    return table


@deployments_app.command("delete")
def deployments_delete(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="ID")],
    json_: JsonFlag = False,
) -> None:
    """Remove a deployment."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        client.deployments.delete(deployment_id)
    if json_:
        _emit({"id": deployment_id, "deleted": True})
    else:
        out.print(f"Deleted deployment {escape(deployment_id)}")


# -- versions and labels -------------------------------------------------------------------


def _versions_table(versions: tuple[DeploymentVersion, ...]) -> Table:
    table = _listing("VERSION", "TRAINING", "STATE", "LABELS", "LOADED", "MESSAGE")
    for v in versions:
        table.add_row(
            str(v.version),
            escape(v.training_id),
            _status(v.state),
            escape(", ".join(v.labels)),
            _when(v.loaded_at),
            _cut(v.status_message or ""),
        )
    return table


@versions_app.command("list")
def versions_list(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="DEPLOYMENT_ID")],
    json_: JsonFlag = False,
) -> None:
    """A deployment's versions, its labels and the version requests get by default."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        found = client.deployments.versions(deployment_id)
    if json_:
        _emit(found.raw)
        return
    out.print(_versions_table(found.items))
    default = "none loaded" if found.default_version is None else str(found.default_version)
    out.print(f"Default version: {default}")


@versions_app.command("add")
def versions_add(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="DEPLOYMENT_ID")],
    training_id: Annotated[str, typer.Argument(metavar="TRAINING_ID")],
    wait: Annotated[bool, typer.Option(help="Wait until it is READY (or FAILED).")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for READY.")] = 300.0,
    json_: JsonFlag = False,
) -> None:
    """Add the deployment's next version from a completed training's SavedModel; the
    deployment answers with its other versions meanwhile."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        version = client.deployments.add_version(deployment_id, training_id)
        if wait and version.state == "DEPLOYING":
            with _spinner(f"loading version {version.version} of {deployment_id}"):
                version = client.deployments.wait_version(deployment_id, version.version, timeout)
    if json_:
        _emit(version.raw)
    else:
        message = f"  {escape(version.status_message)}" if version.status_message else ""
        out.print(
            f"Version [bold]{version.version}[/] of deployment {escape(deployment_id)} "
            f"(training {escape(version.training_id)}): {_status(version.state)}{message}"
        )
    if version.state == "FAILED":
        raise SystemExit(1)


@versions_app.command("unload")
def versions_unload(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="DEPLOYMENT_ID")],
    version: Annotated[int, typer.Argument(metavar="VERSION", min=1)],
    json_: JsonFlag = False,
) -> None:
    """Unload a version: its model process stops (refused while a label points at it)."""
    _session(ctx).json = json_
    with _client(ctx) as client:
        client.deployments.unload_version(deployment_id, version)
    if json_:
        _emit({"id": deployment_id, "version": version, "unloaded": True})
    else:
        out.print(f"Unloaded version {version} of deployment {escape(deployment_id)}")


@deployments_app.command("label")
def deployments_label(
    ctx: typer.Context,
    deployment_id: Annotated[str, typer.Argument(metavar="DEPLOYMENT_ID")],
    label: Annotated[str, typer.Argument(metavar="LABEL")],
    version: Annotated[
        int | None, typer.Argument(metavar="[VERSION]", min=1, help="A loaded version.")
    ] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the label.")] = False,
    json_: JsonFlag = False,
) -> None:
    """Point a label (stable, canary, any name) at a loaded version, or remove it with
    --delete. Requests without a version get the stable label's."""
    _session(ctx).json = json_
    if delete == (version is not None):
        raise typer.BadParameter("give a VERSION, or --delete", param_hint="VERSION")
    with _client(ctx) as client:
        if version is None:
            client.deployments.delete_label(deployment_id, label)
        else:
            client.deployments.set_label(deployment_id, label, version)
    if json_:
        _emit({"id": deployment_id, "label": label, "version": version})
    elif version is None:
        out.print(f"Removed label {escape(label)} of deployment {escape(deployment_id)}")
    else:
        out.print(
            f"Label {escape(label)} of deployment {escape(deployment_id)} -> version {version}"
        )
