"""`client.deployments`: deploy a training's SavedModel, score inputs with it, and manage
its versions and labels."""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from dlaas.errors import WaitTimeout
from dlaas.models import Deployment, DeploymentVersion, VersionList

if TYPE_CHECKING:
    from dlaas.client import Client


class Deployments:
    """`client.deployments`: serve a training's SavedModel and score inputs with it."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, training_id: str, *, name: str | None = None) -> Deployment:
        """Deploy a COMPLETED training's SavedModel: `POST /v1/deployments`.

        Returns the deployment, usually DEPLOYING (`wait` for READY). Raises `NotFound` for
        an unknown training, `Conflict`/`ValidationError` if it has no servable model. A
        training that exports TensorFlow Serving's layout (`<n>/saved_model.pb`) deploys
        with those versions.
        """
        body: dict[str, Any] = {"training_id": training_id}
        if name:
            body["name"] = name
        return Deployment.from_json(self._client._json("POST", "/v1/deployments", json=body))

    def list(self) -> builtins.list[Deployment]:
        """The tenant's deployments: `GET /v1/deployments`."""
        data = self._client._json("GET", "/v1/deployments")
        return [Deployment.from_json(item) for item in data["items"]]

    def get(self, deployment_id: str) -> Deployment:
        """The deployment now, with its versions and labels: `GET /v1/deployments/{id}`.
        Raises `NotFound`."""
        return Deployment.from_json(self._client._json("GET", _path(deployment_id)))

    def wait(
        self, deployment_id: str, timeout: float | None = None, *, poll_interval: float = 0.5
    ) -> Deployment:
        """Wait until the deployment is READY or FAILED and return it (a FAILED one is
        returned, not raised: check `.ready`). Raises `WaitTimeout` after `timeout` seconds,
        `NotFound`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            deployment = self.get(deployment_id)
            if deployment.final:
                return deployment
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"deployment {deployment_id} is still {deployment.status} after {timeout} s",
                    deployment,
                )
            time.sleep(poll_interval)

    def predict(
        self,
        deployment_id: str,
        instances: Sequence[Any] | Any,
        *,
        version: int | None = None,
        label: str | None = None,
    ) -> Any:
        """Score `instances` with the deployed model: `POST /v1/deployments/{id}/predictions`
        with the TensorFlow Serving body `{"instances": [...]}`; returns the `predictions`
        (one per instance). `instances` is a list (or anything with `tolist()`, like a numpy
        array). `version` or `label` picks a version (default: the `stable` label's, else
        the latest loaded). Raises `ValidationError` for inputs the model's signature
        refuses, `NotFound` for an unknown version or label, `Conflict` if the deployment
        is not READY, `RateLimited` above the plan's rate."""
        if hasattr(instances, "tolist"):
            instances = instances.tolist()
        params: dict[str, Any] = {}
        if version is not None:
            params["version"] = version
        if label is not None:
            params["label"] = label
        data = self._client._json(
            "POST",
            f"{_path(deployment_id)}/predictions",
            params=params,
            json={"instances": list(instances)},
        )
        return data["predictions"]

    def delete(self, deployment_id: str) -> None:
        """Remove the deployment: `DELETE /v1/deployments/{id}`. Raises `NotFound`."""
        self._client._request("DELETE", _path(deployment_id))

    # ---- versions and labels ----

    def versions(self, deployment_id: str) -> VersionList:
        """The deployment's versions, labels and default version:
        `GET /v1/deployments/{id}/versions`."""
        return VersionList.from_json(self._client._json("GET", f"{_path(deployment_id)}/versions"))

    def add_version(self, deployment_id: str, training_id: str) -> DeploymentVersion:
        """Add the next version from a COMPLETED training's SavedModel:
        `POST /v1/deployments/{id}/versions`. Returns it DEPLOYING (`wait_version` for
        READY); the deployment goes on answering meanwhile."""
        data = self._client._json(
            "POST", f"{_path(deployment_id)}/versions", json={"training_id": training_id}
        )
        return DeploymentVersion.from_json(data)

    def wait_version(
        self,
        deployment_id: str,
        version: int,
        timeout: float | None = None,
        *,
        poll_interval: float = 0.5,
    ) -> DeploymentVersion:
        """Wait until the version is no longer DEPLOYING and return it (READY or FAILED).
        Raises `WaitTimeout` after `timeout` seconds, `NotFound`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self.versions(deployment_id).version(version)
            if found.state != "DEPLOYING":
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"version {version} of deployment {deployment_id} is still DEPLOYING "
                    f"after {timeout} s",
                    found,
                )
            time.sleep(poll_interval)

    def unload_version(self, deployment_id: str, version: int) -> None:
        """Unload a version (its model process stops):
        `DELETE /v1/deployments/{id}/versions/{version}`. Raises `Conflict` while a label
        points at it."""
        self._client._request("DELETE", f"{_path(deployment_id)}/versions/{int(version)}")

    def set_label(self, deployment_id: str, label: str, version: int) -> None:
        """Point `label` at a loaded version: `PUT /v1/deployments/{id}/labels/{label}`."""
        self._client._json(
            "PUT", f"{_path(deployment_id)}/labels/{_part(label)}", json={"version": version}
        )

    def delete_label(self, deployment_id: str, label: str) -> None:
        """Remove a label: `DELETE /v1/deployments/{id}/labels/{label}`."""
        self._client._request("DELETE", f"{_path(deployment_id)}/labels/{_part(label)}")


def _part(value: str) -> str:
    return quote(value, safe="")


def _path(deployment_id: str) -> str:
    return f"/v1/deployments/{_part(deployment_id)}"
