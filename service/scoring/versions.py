"""Which version of a deployment's model a request names.

TensorFlow Serving's clients name a version (`model_spec.version`, `/versions/<n>`) or a
label (`model_spec.version_label`, `/labels/<label>`), or neither (the default version).
Every path that takes one (the REST paths of `tfs_rest`, the gRPC API) resolves it here,
and only here. A deployment serves one model today, version 1, without labels: no version
or version 1 is that model; any other version, and any label, is `UnknownVersion`, in
TensorFlow Serving's words.
"""

from __future__ import annotations

from service.domain.deployments import ScoringTarget
from service.errors import UnknownVersion

# The version a deployment's one model has.
ONLY_VERSION = 1


def resolve_version(deployment: ScoringTarget, version: int | None, label: str | None) -> int:
    """The version of `deployment` that a request for `version` or `label` (at most one
    of them; neither: the default) is answered by; UnknownVersion when it has none such.
    `deployment.id` is the model's name in the messages."""
    if label is not None:
        raise UnknownVersion(
            f"Servable not found for request: Labeled({deployment.id}, {label}) "
            f"(unrecognized servable version label '{label}')"
        )
    if version is None or version == ONLY_VERSION:
        return ONLY_VERSION
    raise UnknownVersion(f"Servable not found for request: Specific({deployment.id}, {version})")
