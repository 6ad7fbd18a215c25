"""The scheduler-plugins PodGroups of DLAAS_K8S_GANG=coscheduling, through the official
client's custom objects API (the objects themselves: gang.pod_group)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from worker.backends.kubernetes.gang import POD_GROUP_GROUP, POD_GROUP_PLURAL, POD_GROUP_VERSION


class PodGroups:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    def create(self, body: dict[str, Any]) -> bool:
        """Create one; False if it already existed (an earlier start made it)."""
        try:
            self.custom.create_namespaced_custom_object(
                POD_GROUP_GROUP,
                POD_GROUP_VERSION,
                self.namespace,
                POD_GROUP_PLURAL,
                body,
                _preload_content=False,
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def names(self, selector: str) -> list[str]:
        response = self.custom.list_namespaced_custom_object(
            POD_GROUP_GROUP,
            POD_GROUP_VERSION,
            self.namespace,
            POD_GROUP_PLURAL,
            label_selector=selector,
            _preload_content=False,
        )
        items = json.loads(response.data).get("items") or []
        return [item["metadata"]["name"] for item in items if isinstance(item, dict)]

    def delete(self, name: str) -> None:
        """Delete one; one already gone is fine."""
        try:
            self.custom.delete_namespaced_custom_object(
                POD_GROUP_GROUP,
                POD_GROUP_VERSION,
                self.namespace,
                POD_GROUP_PLURAL,
                name,
                _preload_content=False,
            )
        except ApiException as e:
            if e.status != 404:
                raise
