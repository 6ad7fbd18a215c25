"""The training manifest: its model, parsing, and every rule it is checked against.

Pure: no I/O. `load_manifest(text, catalog, plan_name)` is the single entry point the API
uses; it returns a validated `Manifest` or raises `ValidationFailed` / `BadRequest` whose
field errors are JSON pointers into the document *as the user wrote it* (so a seed-style
`COMPUTE_CONFIGURATION` error names `/COMPUTE_CONFIGURATION/nodes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
)

from service.domain.catalog import Catalog, FrameworkSpec
from service.domain.metrics import metric_pattern
from service.domain.quotas import max_runtime_errors
from service.errors import BadRequest, FieldError, ValidationFailed

MAX_MANIFEST_BYTES = 64 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Framework(_Strict):
    name: str = Field(
        description="tensorflow | tensorflow-ddl | tensorflow-horovod | pytorch | pytorch-ddl"
    )
    version: str = Field(description='Framework version from the catalog, e.g. "1.5".')
    command: str = Field(description="Command run in the code directory of every learner.")
    parameter_servers: int | None = Field(
        default=None,
        ge=0,
        description="tensorflow with nodes > 1: learners 1..P are parameter servers "
        "(default 1, must be < nodes; 0 = every learner is a worker, e.g. for "
        "MultiWorkerMirroredStrategy).",
    )

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: object) -> object:
        # YAML reads `version: 1.5` as a float; the catalog speaks in strings.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value


class ComputeConfiguration(_Strict):
    name: str = Field(description="Compute configuration from the catalog, e.g. P100.")
    nodes: int = Field(default=1, ge=1, description="Number of learners.")


class S3Connection(_Strict):
    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region: str | None = None


class DataSource(_Strict):
    bucket: str = Field(min_length=1)
    prefix: str = ""


class ResultsTarget(_Strict):
    bucket: str = Field(min_length=1)


class TrainingDataReference(_Strict):
    type: Literal["s3"]
    connection: S3Connection
    source: DataSource


class TrainingResultsReference(_Strict):
    type: Literal["s3"]
    connection: S3Connection
    target: ResultsTarget


class EvaluationMetric(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
    regex: str = Field(description="Applied to every log line; its one group is the value.")


class TensorBoardMetrics(_Strict):
    """Metrics from TensorBoard event files, as FfDL manifests write them: every scalar the
    training writes (`tf.summary.scalar`) to event files under LOG_DIR, with its step."""

    type: Literal["tensorboard"] = Field(
        description="tensorboard: the scalars of the event files under LOG_DIR are the metrics."
    )
    in_: str | None = Field(
        default=None,
        alias="in",
        max_length=1024,
        description="Accepted as FfDL manifests write it (where the event files are, e.g. "
        '"$JOB_STATE_DIR/logs/tb"); DLaaS reads every event file under LOG_DIR, and a '
        "scalar is named `<directory below LOG_DIR>/<tag>` (the tag alone at its top).",
    )


def _metrics_kind(value: Any) -> str:
    """Which form `evaluation_metrics` takes: a mapping is `{type: tensorboard}`, anything
    else the list of regexes (so a wrong list is told about its items, not about both)."""
    if isinstance(value, Mapping | TensorBoardMetrics):
        return "tensorboard"
    return "regexes"


# The union's tags appear in pydantic's error locations; `_pointer` leaves them out.
_METRICS_TAGS = ("regexes", "tensorboard")
EvaluationMetrics = Annotated[
    Annotated[list[EvaluationMetric], Field(max_length=32), Tag("regexes")]
    | Annotated[TensorBoardMetrics, Tag("tensorboard")],
    Discriminator(_metrics_kind),
]


class RetryPolicy(_Strict):
    """When a failed training is started again, as a new attempt that resumes from the
    checkpoints the last one left in CHECKPOINT_DIR (see service.domain.retries)."""

    max_retries: int = Field(
        default=0, ge=0, description="Attempts after the first; at most the plan's max_retries."
    )
    retry_on_lost: bool = Field(
        default=False,
        description="Retry when a learner is lost: its process or pod gone, killed by "
        "SIGKILL (the out-of-memory killer, a node shut down), or the platform shut down.",
    )
    retry_on_exit_codes: list[int] = Field(
        default_factory=list,
        max_length=32,
        description="Retry when a learner's command exits with one of these codes (1..255).",
    )


class Manifest(_Strict):
    """A training manifest in canonical form (the seed documents' flat keys are aliases)."""

    model_config = ConfigDict(
        extra="forbid",
        title="DLaaS training manifest",
        json_schema_extra={
            "$comment": "Also accepted: FRAMEWORK_NAME, FRAMEWORK_VERSION, EXECUTION_COMMAND "
            "and COMPUTE_CONFIGURATION as aliases of framework.name, framework.version, "
            "framework.command and compute_configuration."
        },
    )

    name: str = Field(min_length=1, max_length=128)
    description: str | None = Field(default=None, max_length=4096)
    framework: Framework
    compute_configuration: ComputeConfiguration
    training_data_reference: TrainingDataReference | None = None
    training_results_reference: TrainingResultsReference | None = None
    evaluation_metrics: EvaluationMetrics = Field(
        default_factory=list,
        description="Regexes applied to every log line (a list), or `{type: tensorboard}`: "
        "the scalars of the TensorBoard event files under LOG_DIR.",
    )
    max_runtime: int | None = Field(
        default=None,
        gt=0,
        description="Seconds; a training running longer is FAILED. Not given: the plan's "
        "default; at most the plan's maximum.",
    )
    retry_policy: RetryPolicy | None = Field(
        default=None, description="Not given: a failed training is not retried."
    )
    conventions: Literal["dlaas", "ffdl"] | None = Field(
        default=None,
        description="The learners' host names and variables: dlaas (not given) names "
        "learner i `$LEARNER_NAME_PREFIX-$LEARNER_ID`, from 1; ffdl as FfDL does, "
        "`$LEARNER_NAME_PREFIX-<i>` from 0 (LEARNER_ID i+1), with FfDL's variables. "
        "A manifest in FfDL's format is translated with `ffdl`.",
    )

    @property
    def nodes(self) -> int:
        return self.compute_configuration.nodes

    @property
    def tensorboard_metrics(self) -> bool:
        """Whether the metrics are read from TensorBoard event files (else from log lines)."""
        return isinstance(self.evaluation_metrics, TensorBoardMetrics)

    def parameter_servers_in(self, catalog: Catalog) -> int:
        """How many learners (1..P) serve parameters, the framework as `catalog` has it."""
        framework = catalog.frameworks.get(self.framework.name)
        return parameter_server_count(
            framework.distribution if framework else None,
            self.nodes,
            self.framework.parameter_servers,
        )


def takes_parameter_servers(distribution: str | None, nodes: int) -> bool:
    """Whether learners of a training may serve parameters: those of a framework the
    catalog distributes as a parameter-server cluster (tensorflow), on more than one node."""
    return distribution == "parameter_server" and nodes > 1


def parameter_server_count(distribution: str | None, nodes: int, requested: int | None) -> int:
    """Learners 1..P serve parameters: P is `framework.parameter_servers` as the manifest
    asks (1 when it does not say) where `takes_parameter_servers`, else 0.

    `distribution` is the framework's `FrameworkSpec.distribution` (None: not in the
    catalog). The manifest (`Manifest.parameter_servers_in`) and the worker reading a stored
    manifest back (`worker.execution.training_spec`) both ask this.
    """
    if not takes_parameter_servers(distribution, nodes):
        return 0
    return 1 if requested is None else requested


def tensorboard_metrics(document: Mapping[str, Any]) -> bool:
    """Whether a stored manifest (its canonical JSON document) reads its metrics from
    TensorBoard event files (`evaluation_metrics: {type: tensorboard}`), not log lines."""
    metrics = document.get("evaluation_metrics")
    return isinstance(metrics, Mapping) and metrics.get("type") == "tensorboard"


def log_metric_definitions(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A stored manifest's `evaluation_metrics` regexes as (name, regex) pairs, in order
    (none for a training without them, or whose metrics come from TensorBoard)."""
    metrics = document.get("evaluation_metrics")
    if not isinstance(metrics, list):
        return []
    return [(str(m["name"]), str(m["regex"])) for m in metrics if isinstance(m, Mapping)]


# Seed key -> (canonical parent, canonical key). Only the top level has aliases.
_ALIASES: dict[str, tuple[str | None, str]] = {
    "FRAMEWORK_NAME": ("framework", "name"),
    "FRAMEWORK_VERSION": ("framework", "version"),
    "EXECUTION_COMMAND": ("framework", "command"),
    "COMPUTE_CONFIGURATION": (None, "compute_configuration"),
}


# Anchors and aliases are accepted, but a few bytes of them can stand for an exponential
# document ("billion laughs", CVE-2019-11253): the document as its aliases expand is
# bounded, counted on the composed node graph (each anchored node once) before anything
# is constructed.
MAX_YAML_NODES = 10_000
MAX_YAML_DEPTH = 64


class _ManifestTooLarge(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader that refuses nesting deeper than MAX_YAML_DEPTH while composing (so a
    deep document never reaches Python's recursion limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _ManifestTooLarge(f"nests deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node) -> None:
    """Raise _ManifestTooLarge if the document, every alias expanded, has more than
    MAX_YAML_NODES nodes or nests deeper than MAX_YAML_DEPTH; linear in the composed graph
    (an aliased node's size and depth are computed once)."""
    sizes: dict[int, tuple[int, int]] = {}
    visiting: set[int] = set()

    def walk(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            raise _ManifestTooLarge("has an alias that refers to a node containing it")
        visiting.add(key)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        size, depth = 1, 0
        for child in children:
            child_size, child_depth = walk(child)
            size += child_size
            depth = max(depth, child_depth)
            if size > MAX_YAML_NODES:
                raise _ManifestTooLarge(
                    f"expands to more than {MAX_YAML_NODES} YAML nodes (an alias counts "
                    "as the whole node it refers to)"
                )
        if depth + 1 > MAX_YAML_DEPTH:
            raise _ManifestTooLarge(
                f"nests deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded"
            )
        visiting.discard(key)
        sizes[key] = (size, depth + 1)
        return sizes[key]

    walk(root)


def _unshared(value: Any) -> Any:
    """A copy in which an aliased mapping or list is its own object at each place it is
    used (bounded by MAX_YAML_NODES), so that changing one place (sealing the data
    connection's secrets) never changes another (the results connection)."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def _load_yaml(text: str) -> Any:
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return _unshared(loader.construct_document(node))
    finally:
        loader.dispose()


def parse_manifest_text(text: str | bytes) -> dict[str, Any]:
    """YAML or JSON text -> a mapping, or BadRequest naming the `manifest` field."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise _unreadable(f"is larger than {MAX_MANIFEST_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _unreadable("is not UTF-8 text") from e
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else _load_yaml(text)
    except _ManifestTooLarge as e:
        raise _unreadable(str(e)) from e
    except RecursionError as e:  # JSON nested deeper than the parser can follow
        raise _unreadable(f"nests deeper than {MAX_YAML_DEPTH} levels") from e
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise _unreadable(f"is not valid YAML or JSON: {e}") from e
    if not isinstance(data, dict):
        raise _unreadable("must be a YAML or JSON mapping (key: value pairs)")
    return data


def _unreadable(why: str) -> BadRequest:
    message = f"the manifest {why}"
    return BadRequest(message, errors=[FieldError("manifest", message)])


def normalize_aliases(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Fold the seed documents' flat keys into the canonical form.

    Returns the canonical mapping and a map canonical pointer -> pointer as written, used
    to report errors in the user's own terms.
    """
    out = {k: v for k, v in data.items() if k not in _ALIASES}
    written_as: dict[str, str] = {}
    errors: list[FieldError] = []
    for alias, (parent, key) in _ALIASES.items():
        if alias not in data:
            continue
        target = out
        if parent is not None:
            existing = out.get(parent, {})
            if not isinstance(existing, dict):
                errors.append(FieldError(f"/{parent}", "must be a mapping"))
                continue
            target = out[parent] = dict(existing)  # never mutate the caller's document
        canonical = f"/{parent}/{key}" if parent else f"/{key}"
        if key in target:
            errors.append(FieldError(f"/{alias}", f"is given twice (also as {canonical})"))
            continue
        target[key] = data[alias]
        written_as[canonical] = f"/{alias}"
    if errors:
        raise ValidationFailed(errors)
    return out, written_as


_PYDANTIC_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "is not a known manifest field",
}


def _pointer(loc: tuple[int | str, ...]) -> str:
    if len(loc) > 1 and loc[0] == "evaluation_metrics" and loc[1] in _METRICS_TAGS:
        loc = (loc[0], *loc[2:])
    return "/" + "/".join(str(part) for part in loc)


def _as_written(pointer: str, written_as: Mapping[str, str]) -> str:
    """`pointer` in the document as the user wrote it: the longest canonical pointer of
    `written_as` it is or is below, replaced by what it was written as."""
    best = ""
    for canonical in written_as:
        if (pointer == canonical or pointer.startswith(canonical + "/")) and len(canonical) > len(
            best
        ):
            best = canonical
    if not best:
        return pointer
    return written_as[best] + pointer[len(best) :]


def as_written(errors: list[FieldError], written_as: Mapping[str, str]) -> list[FieldError]:
    """Field errors about the canonical manifest, named as the user wrote the document."""
    return [FieldError(_as_written(e.field, written_as), e.message) for e in errors]


def check_rules(manifest: Manifest, catalog: Catalog, plan_name: str) -> list[FieldError]:
    """The catalog and plan rules; an empty list means the manifest is acceptable."""
    framework = catalog.frameworks.get(manifest.framework.name)
    distributed = manifest.nodes > 1 or (
        framework is not None and framework.requires_multiple_nodes
    )
    return [
        *_framework_errors(manifest.framework, framework, catalog),
        *_compute_errors(manifest, framework, distributed, catalog),
        *_parameter_server_errors(manifest.framework, framework, manifest.nodes),
        *(
            _metric_errors(manifest.evaluation_metrics)
            if isinstance(manifest.evaluation_metrics, list)
            else []
        ),
        *_plan_errors(manifest.nodes, distributed, catalog, plan_name),
        *_runtime_errors(manifest.max_runtime, catalog, plan_name),
        *_retry_errors(manifest.retry_policy, catalog, plan_name),
    ]


def _framework_errors(
    fw: Framework, framework: FrameworkSpec | None, catalog: Catalog
) -> Iterator[FieldError]:
    """The framework is in the catalog, in a version it offers, with a command to run."""
    if framework is None:
        yield FieldError(
            "/framework/name",
            f"unknown framework '{fw.name}'; supported: {', '.join(sorted(catalog.frameworks))}",
        )
    elif fw.version not in framework.versions:
        yield FieldError(
            "/framework/version",
            f"{fw.name} version '{fw.version}' is not supported; "
            f"supported versions: {', '.join(framework.versions)}",
        )
    if not fw.command.strip():
        yield FieldError("/framework/command", "must not be empty")


def _compute_errors(
    manifest: Manifest, framework: FrameworkSpec | None, distributed: bool, catalog: Catalog
) -> Iterator[FieldError]:
    """The compute configuration is in the catalog, and a distributed training gets the
    nodes and the compute configuration it needs."""
    name = manifest.compute_configuration.name
    compute = catalog.compute_configurations.get(name)
    if compute is None:
        yield FieldError(
            "/compute_configuration/name",
            f"unknown compute configuration '{name}'; "
            f"supported: {', '.join(catalog.compute_configurations)}",
        )
    if framework is not None and framework.requires_multiple_nodes and manifest.nodes < 2:
        yield FieldError(
            "/compute_configuration/nodes",
            f"{manifest.framework.name} is distributed: nodes must be > 1",
        )
    if distributed and compute is not None and not compute.supports_distributed:
        distributed_ok = [
            n for n, c in catalog.compute_configurations.items() if c.supports_distributed
        ]
        yield FieldError(
            "/compute_configuration/name",
            f"{name} does not support distributed training; "
            f"use one of: {', '.join(distributed_ok) or 'none in this catalog'}",
        )


def _parameter_server_errors(
    fw: Framework, framework: FrameworkSpec | None, nodes: int
) -> Iterator[FieldError]:
    """Parameter servers are asked only of a training that takes them, and leave at least
    one learner to work."""
    if fw.parameter_servers is None:
        return
    if not takes_parameter_servers(framework.distribution if framework else None, nodes):
        yield FieldError(
            "/framework/parameter_servers", "applies only to tensorflow trainings with nodes > 1"
        )
    elif fw.parameter_servers >= nodes:
        yield FieldError(
            "/framework/parameter_servers",
            f"must be less than nodes ({nodes}) so at least one learner is a worker",
        )


def _metric_errors(metrics: list[EvaluationMetric]) -> Iterator[FieldError]:
    """Metric names are unique; each regex compiles (with RE2) and captures exactly the
    value."""
    seen: set[str] = set()
    for i, metric in enumerate(metrics):
        if metric.name in seen:
            yield FieldError(f"/evaluation_metrics/{i}/name", "is given twice")
        seen.add(metric.name)
        try:
            groups = metric_pattern(metric.regex).groups
        except ValueError as e:
            yield FieldError(f"/evaluation_metrics/{i}/regex", str(e))
            continue
        if groups != 1:
            yield FieldError(
                f"/evaluation_metrics/{i}/regex",
                f"must have exactly one capturing group (the value); it has {groups}",
            )


def _runtime_errors(max_runtime: int | None, catalog: Catalog, plan_name: str) -> list[FieldError]:
    plan = catalog.plans.get(plan_name)
    return [] if plan is None else max_runtime_errors(plan_name, plan, max_runtime)


def _retry_errors(
    policy: RetryPolicy | None, catalog: Catalog, plan_name: str
) -> Iterator[FieldError]:
    """Retries are capped by the plan; the exit codes listed are failures (0 never is)."""
    if policy is None:
        return
    plan = catalog.plans.get(plan_name)
    if plan is not None and policy.max_retries > plan.max_retries:
        yield FieldError(
            "/retry_policy/max_retries",
            f"the {plan_name} plan allows at most {plan.max_retries} retries; "
            f"got {policy.max_retries}",
        )
    seen: set[int] = set()
    for i, code in enumerate(policy.retry_on_exit_codes):
        if not 1 <= code <= 255:
            yield FieldError(
                f"/retry_policy/retry_on_exit_codes/{i}",
                f"must be an exit code from 1 to 255 (0 is success); got {code}",
            )
        elif code in seen:
            yield FieldError(f"/retry_policy/retry_on_exit_codes/{i}", f"{code} is given twice")
        seen.add(code)


def _plan_errors(
    nodes: int, distributed: bool, catalog: Catalog, plan_name: str
) -> Iterator[FieldError]:
    """The tenant's plan is offered and allows the training's distribution and nodes."""
    plan = catalog.plans.get(plan_name)
    if plan is None:  # a tenant whose plan left the catalog: refuse rather than guess
        yield FieldError("/compute_configuration", f"plan '{plan_name}' is not offered")
    elif distributed and not plan.distributed:
        field = "/compute_configuration/nodes" if nodes > 1 else "/framework/name"
        yield FieldError(field, f"the {plan_name} plan does not support distributed training")
    elif nodes > plan.max_nodes:
        yield FieldError(
            "/compute_configuration/nodes",
            f"the {plan_name} plan allows at most {plan.max_nodes} nodes",
        )
    elif nodes > plan.active_nodes_limit:
        yield FieldError(
            "/compute_configuration/nodes",
            f"the {plan_name} plan allows at most {plan.active_nodes_limit} active learners "
            f"at once (max_active_nodes); got {nodes} nodes",
        )


def load_manifest(
    data: Mapping[str, Any],
    catalog: Catalog,
    plan_name: str,
    *,
    written_as: Mapping[str, str] | None = None,
) -> Manifest:
    """Validate a parsed manifest; raise ValidationFailed listing every offending field.
    `written_as`: canonical pointer -> pointer in the document as submitted, for a
    manifest translated from another format (service.domain.manifest_formats)."""
    canonical, aliases = normalize_aliases(data)
    written_as = {**(written_as or {}), **aliases}
    try:
        manifest = Manifest.model_validate(canonical)
    except ValidationError as e:
        errors = [
            FieldError(
                _as_written(_pointer(err["loc"]), written_as),
                _PYDANTIC_MESSAGES.get(err["type"], err["msg"]),
            )
            for err in e.errors()
        ]
        raise ValidationFailed(errors) from e
    errors = [
        FieldError(_as_written(err.field, written_as), err.message)
        for err in check_rules(manifest, catalog, plan_name)
    ]
    if errors:
        raise ValidationFailed(errors)
    return manifest


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema kept in manifests/manifest.schema.json."""
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


if __name__ == "__main__":  # python -m service.domain.manifest > manifests/manifest.schema.json
    print(json.dumps(manifest_json_schema(), indent=2, sort_keys=True))
