"""The chart's gang scheduling values (learners.gang): the settings they become, the
Role's PodGroup rule only with coscheduling, every object still valid Kubernetes, and a
value outside the schema refused."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from tests.deploy.chart import CHART, env_of, objects
from tests.deploy.test_chart import EXPECTED_RULES, KUBERNETES_VERSIONS, _containers

POD_GROUP_RULE = {
    "apiGroups": ["scheduling.x-k8s.io"],
    "resources": ["podgroups"],
    "verbs": ["create", "list", "delete"],
}
GANGS: dict[str, dict[str, Any]] = {
    "none": {},
    "kueue": {"scheduler": "kueue", "kueueQueue": "gpu-queue"},
    "coscheduling": {"scheduler": "coscheduling", "schedulerName": "sched-plugins"},
}


def rendered(gang: str) -> list[dict[str, Any]]:
    return objects({"learners": {"gang": {**GANGS[gang], "unschedulableSeconds": 600}}})


@pytest.mark.parametrize("gang", list(GANGS))
def test_the_gang_values_become_the_settings_and_the_objects_stay_valid(gang: str) -> None:
    objs = rendered(gang)
    for obj in objs:
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[0], strict=True)
    expected = {
        "DLAAS_K8S_GANG": gang,
        "DLAAS_K8S_KUEUE_QUEUE": GANGS[gang].get("kueueQueue", "dlaas"),
        "DLAAS_K8S_SCHEDULER_NAME": GANGS[gang].get("schedulerName", "scheduler-plugins-scheduler"),
        "DLAAS_K8S_UNSCHEDULABLE_SECONDS": "600",
    }
    for component, container in _containers(objs):
        if component not in ("worker", "monitor"):
            continue
        env = env_of(container)
        assert {k: env[k]["value"] for k in expected} == expected, component


@pytest.mark.parametrize("gang", list(GANGS))
def test_the_role_allows_pod_groups_only_with_coscheduling(gang: str) -> None:
    (role,) = [o for o in rendered(gang) if o["kind"] == "Role"]
    extra = [POD_GROUP_RULE] if gang == "coscheduling" else []
    assert role["rules"] == EXPECTED_RULES + extra


def test_an_unknown_gang_scheduler_fails_the_install() -> None:
    report = helm.lint(
        str(CHART), {"learners": {"gang": {"scheduler": "volcano"}}}, strict=True,
        kube_version="v1.35.0",
    )  # fmt: skip
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 2]
