"""Which version of a deployment a scoring request gets: the one function every way in
(the platform's REST route, TensorFlow Serving's REST paths and gRPC API) resolves a
request's (version, label) through."""

from __future__ import annotations

from service.domain.deployments import ScoringTarget
from service.domain.versions import VersionState, resolve


def resolve_version(deployment: ScoringTarget, version: int | None, label: str | None) -> int:
    """The loaded version a request for `version` or `label` (or neither: the `stable`
    label's version where it is set, else the latest loaded one, as TensorFlow Serving's
    default policy) is answered by. Raises UnknownVersion (404, gRPC NOT_FOUND) for a
    version or label the deployment does not serve, BadRequest for both at once."""
    if not deployment.versions:  # a target without versions: its one model is version 1
        states = {deployment.version: VersionState.READY}
    else:
        states = {n: VersionState(v.state) for n, v in deployment.versions.items()}
    return resolve(deployment.id, states, deployment.labels, version, label)
