"""Every manifest rule, as data: each case is a manifest, the tenant's plan, the field the
refusal must name and words its message must contain. Used by the domain tests and by the
API tests (which also check the status code)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def base(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "mnist",
        "framework": {"name": "tensorflow", "version": "1.5", "command": "python3 train.py"},
        "compute_configuration": {"name": "P100", "nodes": 1},
    }
    for key, value in overrides.items():
        if value is None:
            doc.pop(key, None)
        elif isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def seed(**overrides: Any) -> dict[str, Any]:
    """The seed documents' flat form."""
    doc: dict[str, Any] = {
        "name": "seed-style",
        "FRAMEWORK_NAME": "tensorflow",
        "FRAMEWORK_VERSION": "1.5",
        "COMPUTE_CONFIGURATION": {"name": "P100", "nodes": 2},
        "EXECUTION_COMMAND": "python3 launcher.py",
    }
    doc.update(overrides)
    return doc


@dataclass(frozen=True)
class Case:
    id: str
    manifest: dict[str, Any]
    field: str
    words: str
    plan: str = "standard"
    status: int = 422


REJECTED = [
    Case(
        "retries-above-plan",
        base(retry_policy={"max_retries": 2, "retry_on_lost": True}),
        "/retry_policy/max_retries",
        "the lite plan allows at most 1 retries; got 2",
        plan="lite",
    ),
    Case(
        "retry-on-exit-code-0",
        base(retry_policy={"max_retries": 1, "retry_on_exit_codes": [3, 0]}),
        "/retry_policy/retry_on_exit_codes/1",
        "1 to 255 (0 is success)",
    ),
    Case(
        "retry-on-exit-code-twice",
        base(retry_policy={"max_retries": 1, "retry_on_exit_codes": [3, 3]}),
        "/retry_policy/retry_on_exit_codes/1",
        "3 is given twice",
    ),
    Case(
        "retries-negative",
        base(retry_policy={"max_retries": -1}),
        "/retry_policy/max_retries",
        "greater than or equal to 0",
    ),
    Case(
        "retry-policy-unknown-key",
        base(retry_policy={"max_retries": 1, "backoff": 3}),
        "/retry_policy/backoff",
        "",
    ),
    Case(
        "nodes-zero",
        base(compute_configuration={"nodes": 0}),
        "/compute_configuration/nodes",
        "greater than or equal to 1",
    ),
    Case(
        "nodes-not-int",
        base(compute_configuration={"nodes": "two"}),
        "/compute_configuration/nodes",
        "integer",
    ),
    Case(
        "unknown-framework",
        base(framework={"name": "caffe"}),
        "/framework/name",
        "supported: pytorch, pytorch-ddl, tensorflow, tensorflow-ddl, tensorflow-horovod",
    ),
    Case(
        "unknown-version",
        base(framework={"version": "0.9"}),
        "/framework/version",
        "supported versions: 1.5, 2.21",
    ),
    Case(
        "unknown-compute",
        base(compute_configuration={"name": "TPU"}),
        "/compute_configuration/name",
        "unknown compute configuration 'TPU'",
    ),
    Case(
        "ddl-single-node",
        base(framework={"name": "tensorflow-ddl"}),
        "/compute_configuration/nodes",
        "nodes must be > 1",
    ),
    Case(
        "horovod-single-node",
        base(framework={"name": "tensorflow-horovod"}),
        "/compute_configuration/nodes",
        "nodes must be > 1",
    ),
    Case(
        "horovod-k80",
        base(
            framework={"name": "tensorflow-horovod"},
            compute_configuration={"name": "K80", "nodes": 2},
        ),
        "/compute_configuration/name",
        "does not support distributed training",
    ),
    Case(
        "ddl-v100",
        base(
            framework={"name": "tensorflow-ddl"}, compute_configuration={"name": "V100", "nodes": 4}
        ),
        "/compute_configuration/name",
        "use one of: P100",
    ),
    Case(
        "ps-k80",
        base(compute_configuration={"name": "K80", "nodes": 3}),
        "/compute_configuration/name",
        "does not support distributed training",
    ),
    Case(
        "ps-equal-nodes",
        base(framework={"parameter_servers": 2}, compute_configuration={"nodes": 2}),
        "/framework/parameter_servers",
        "less than nodes (2)",
    ),
    Case(
        "ps-negative",
        base(framework={"parameter_servers": -1}, compute_configuration={"nodes": 3}),
        "/framework/parameter_servers",
        "greater than or equal to 0",
    ),
    Case(
        "ps-single-node",
        base(framework={"parameter_servers": 1}),
        "/framework/parameter_servers",
        "nodes > 1",
    ),
    Case(
        "ps-on-horovod",
        base(
            framework={"name": "tensorflow-horovod", "parameter_servers": 1},
            compute_configuration={"nodes": 2},
        ),
        "/framework/parameter_servers",
        "only to tensorflow",
    ),
    Case(
        "command-missing",
        base(framework={"name": "tensorflow", "version": "1.5"})
        | {"framework": {"name": "tensorflow", "version": "1.5"}},
        "/framework/command",
        "required",
    ),
    Case(
        "command-blank",
        base(framework={"command": "   "}),
        "/framework/command",
        "must not be empty",
    ),
    Case("name-missing", base(name=None), "/name", "required"),
    Case("max-runtime-zero", base(max_runtime=0), "/max_runtime", "greater than 0"),
    Case("max-runtime-text", base(max_runtime="an hour"), "/max_runtime", "integer"),
    Case(
        "metric-bad-regex",
        base(evaluation_metrics=[{"name": "loss", "regex": "loss=(["}]),
        "/evaluation_metrics/0/regex",
        "does not compile",
    ),
    Case(
        "metric-backreference",
        base(evaluation_metrics=[{"name": "loss", "regex": r"(a)\1"}]),
        "/evaluation_metrics/0/regex",
        "no backreferences",
    ),
    Case(
        "metric-lookahead",
        base(
            evaluation_metrics=[
                {"name": "acc", "regex": r"acc=([0-9.]+)"},
                {"name": "loss", "regex": r"loss=(?=\d)([0-9.]+)"},
            ]
        ),
        "/evaluation_metrics/1/regex",
        "invalid perl operator: (?=",
    ),
    Case(
        "metric-no-group",
        base(evaluation_metrics=[{"name": "loss", "regex": "loss=[0-9.]+"}]),
        "/evaluation_metrics/0/regex",
        "exactly one capturing group",
    ),
    Case(
        "metric-two-groups",
        base(
            evaluation_metrics=[
                {"name": "acc", "regex": "acc=([0-9.]+)"},
                {"name": "loss", "regex": "(loss)=([0-9.]+)"},
            ]
        ),
        "/evaluation_metrics/1/regex",
        "it has 2",
    ),
    Case(
        "metric-duplicate",
        base(
            evaluation_metrics=[
                {"name": "loss", "regex": "loss=([0-9.]+)"},
                {"name": "loss", "regex": "l=([0-9.]+)"},
            ]
        ),
        "/evaluation_metrics/1/name",
        "given twice",
    ),
    Case(
        "unknown-key",
        base(framwork={"name": "tensorflow"}),
        "/framwork",
        "not a known manifest field",
    ),
    Case(
        "data-ref-type",
        base(
            training_data_reference={
                "type": "ftp",
                "connection": {
                    "endpoint_url": "http://127.0.0.1:9000",
                    "access_key_id": "a",
                    "secret_access_key": "b",
                },
                "source": {"bucket": "data"},
            }
        ),
        "/training_data_reference/type",
        "'s3'",
    ),
    Case(
        "lite-nodes",
        base(compute_configuration={"nodes": 2}),
        "/compute_configuration/nodes",
        "the lite plan does not support distributed training",
        plan="lite",
    ),
    Case(
        "lite-horovod",
        base(framework={"name": "tensorflow-horovod"}, compute_configuration={"nodes": 2}),
        "/compute_configuration/nodes",
        "lite plan",
        plan="lite",
    ),
    Case(
        "standard-node-cap",
        base(compute_configuration={"nodes": 17}),
        "/compute_configuration/nodes",
        "at most 16 nodes",
    ),
    # The seed documents' flat keys: errors name the key as the user wrote it.
    Case("seed-lite", seed(), "/COMPUTE_CONFIGURATION/nodes", "lite plan", plan="lite"),
    Case(
        "seed-bad-version",
        seed(FRAMEWORK_VERSION="9.9"),
        "/FRAMEWORK_VERSION",
        "supported versions",
    ),
    Case(
        "seed-bad-framework",
        seed(FRAMEWORK_NAME="caffe"),
        "/FRAMEWORK_NAME",
        "unknown framework 'caffe'",
    ),
    Case(
        "seed-ddl-k80",
        seed(FRAMEWORK_NAME="tensorflow-ddl", COMPUTE_CONFIGURATION={"name": "K80", "nodes": 2}),
        "/COMPUTE_CONFIGURATION/name",
        "does not support distributed",
    ),
    Case(
        "pytorch-ddl-single-node",
        base(framework={"name": "pytorch-ddl", "version": "2.13"}),
        "/compute_configuration/nodes",
        "pytorch-ddl is distributed: nodes must be > 1",
    ),
    Case(
        "pytorch-parameter-servers",
        base(
            framework={"name": "pytorch", "version": "2.13", "parameter_servers": 1},
            compute_configuration={"nodes": 2},
        ),
        "/framework/parameter_servers",
        "applies only to tensorflow trainings",
    ),
    Case(
        "seed-nodes-zero",
        seed(COMPUTE_CONFIGURATION={"name": "P100", "nodes": 0}),
        "/COMPUTE_CONFIGURATION/nodes",
        "greater than or equal to 1",
    ),
    Case(
        "seed-command-missing",
        {k: v for k, v in seed().items() if k != "EXECUTION_COMMAND"},
        "/framework/command",
        "required",
    ),
    Case(
        "seed-alias-twice", seed(framework={"name": "tensorflow"}), "/FRAMEWORK_NAME", "given twice"
    ),
]

ACCEPTED = [
    (
        "retry-policy",
        base(retry_policy={"max_retries": 1, "retry_on_lost": True, "retry_on_exit_codes": [3]}),
        "lite",
    ),
    (
        "all-workers",
        base(framework={"parameter_servers": 0}, compute_configuration={"nodes": 2}),
        "standard",
    ),
    ("single-node-tensorflow", base(), "lite"),
    ("version-as-yaml-float", base(framework={"version": 1.5}), "lite"),
    (
        "ps-training",
        base(compute_configuration={"nodes": 3}, framework={"parameter_servers": 2}),
        "standard",
    ),
    (
        "ddl",
        base(framework={"name": "tensorflow-ddl"}, compute_configuration={"nodes": 2}),
        "standard",
    ),
    (
        "horovod-2x",
        base(
            framework={"name": "tensorflow-horovod", "version": "2.21"},
            compute_configuration={"name": "P100x2", "nodes": 4},
        ),
        "standard",
    ),
    ("seed-flat-keys", seed(), "standard"),
    (
        "seed-flat-keys-pytorch",
        seed(
            FRAMEWORK_NAME="pytorch", FRAMEWORK_VERSION="2.13", EXECUTION_COMMAND="python train.py"
        ),
        "standard",
    ),
    ("pytorch-single", base(framework={"name": "pytorch", "version": "2.13"}), "lite"),
    (
        "pytorch-ddl",
        base(
            framework={"name": "pytorch-ddl", "version": 2.13}, compute_configuration={"nodes": 2}
        ),
        "standard",
    ),
    (
        "metrics-and-runtime",
        base(
            max_runtime=3600, evaluation_metrics=[{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}]
        ),
        "standard",
    ),
    (
        # Exponential for a backtracking matcher, linear on RE2 (tests/unit/test_logs.py).
        "metrics-nested-quantifiers",
        base(
            evaluation_metrics=[
                {"name": "a", "regex": "(a+)+$"},
                {"name": "x", "regex": "(x+x+)+y"},
                {"name": "named", "regex": r"loss=(?P<value>[0-9.]+)"},
            ]
        ),
        "standard",
    ),
    (
        "data-reference",
        base(
            training_data_reference={
                "type": "s3",
                "connection": {
                    "endpoint_url": "http://127.0.0.1:9000",
                    "access_key_id": "a",
                    "secret_access_key": "b",
                },
                "source": {"bucket": "mnist-data"},
            }
        ),
        "standard",
    ),
]
