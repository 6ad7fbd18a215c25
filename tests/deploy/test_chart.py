"""The Helm chart renders offline and every object it renders is valid Kubernetes, with the
permissions, probes, hooks, settings and security the platform needs (no cluster here:
kubernetes-validate checks each object against the API's published schemas, strictly)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.domain.catalog import DEFAULT_CATALOG
from service.platform import load_catalog
from service.scoring.app import create_scoring_app
from service.settings import Settings
from tests.deploy.chart import (
    CHART,
    EXTERNAL_VALUES,
    NAMESPACE,
    RELEASE,
    env_of,
    named,
    objects,
    pod_spec,
    render,
)
from tests.deploy.commands import command_problems

# A recent Kubernetes that kubernetes-validate ships the schemas of (strict: unknown fields
# are errors), and the oldest the chart supports (Chart.yaml's kubeVersion).
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
FULLNAME = f"{RELEASE}-dlaas"
PLATFORM_COMPONENTS = ("api", "worker", "monitor")
# The settings of the Kubernetes backend (issue 15's names), set by the chart.
K8S_SETTINGS = {
    "DLAAS_K8S_NAMESPACE",
    "DLAAS_K8S_IMAGE_PREFIX",
    "DLAAS_K8S_IMAGE_TAG",
    "DLAAS_K8S_IMAGE_PULL_SECRETS",
    "DLAAS_K8S_GPU_RESOURCE",
    "DLAAS_K8S_CLUSTER_DOMAIN",
    "DLAAS_K8S_POD_TTL_SECONDS",
}

# What the Kubernetes backend does in its namespace, and nothing more: learner pods
# (created, watched, their log read as a fallback, deleted), a training's headless Service,
# its per-training Secret (credentials, the MPI key pair: created and deleted, never read or
# listed, so not the platform's either) and its NetworkPolicy. Kept here, not read from the
# chart, so that a change to the Role has to change this list too; tests/k8s/test_backend.py
# checks it is exactly what the backend's requests need.
EXPECTED_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["create", "list", "delete"],
    },
]
BACKEND_SERVICE_ACCOUNT = f"{FULLNAME}-backend"
# Each service account's rules in the release's namespace: the platform's components (API,
# scoring, migrations) none, the backend's (worker, monitor) the Role above.
SERVICE_ACCOUNT_RULES: dict[str, list[dict[str, Any]]] = {
    FULLNAME: [],
    BACKEND_SERVICE_ACCOUNT: EXPECTED_RULES,
}

VALUE_SETS = {"default": None, "external": EXTERNAL_VALUES}


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return objects(VALUE_SETS[request.param])


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    return objects()


@pytest.fixture(scope="module")
def external_objects() -> list[dict[str, Any]]:
    return objects(EXTERNAL_VALUES)


def _containers(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(component, container) of every platform workload: Deployments and the Job."""
    found: list[tuple[str, dict[str, Any]]] = []
    for obj in objs:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        component = obj["metadata"]["labels"].get("app.kubernetes.io/component", "")
        if component == "redis":  # the bundled servers run their own images
            continue
        found.extend((component, c) for c in pod_spec(obj)["containers"])
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(
    rendered: list[dict[str, Any]], version: str
) -> None:
    assert rendered
    for obj in rendered:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {e.path}")


def test_the_validation_is_strict() -> None:
    """The check above can fail: a misspelt field is refused."""
    deployment = named(objects(), "Deployment", f"{FULLNAME}-api")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("values", list(VALUE_SETS))
def test_helm_lint_finds_no_error_or_warning(values: str) -> None:
    report = helm.lint(str(CHART), VALUE_SETS[values], strict=True, kube_version="v1.35.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_install_bundles_postgresql_redis_and_minio(
    default_objects: list[dict[str, Any]],
) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in default_objects}
    assert ("StatefulSet", f"{FULLNAME}-postgresql") in kinds
    assert ("Deployment", f"{FULLNAME}-redis") in kinds
    assert ("StatefulSet", f"{FULLNAME}-minio") in kinds
    secret = named(default_objects, "Secret", f"{FULLNAME}-secrets")["stringData"]
    password = secret["postgres-password"]
    assert secret["DLAAS_DATABASE_URL"] == (
        f"postgresql+psycopg://dlaas:{password}@{FULLNAME}-postgresql:5432/dlaas"
    )
    assert secret["DLAAS_BROKER_URL"].endswith(f"@{FULLNAME}-redis:6379/0")
    assert secret["DLAAS_S3_ACCESS_KEY"] == secret["minio-root-user"]
    for key in ("DLAAS_ADMIN_API_KEY", "DLAAS_SECRET_KEY", "postgres-password"):
        assert len(secret[key]) >= 32, key


def test_external_services_deploy_no_server_and_reach_the_given_ones(
    external_objects: list[dict[str, Any]],
) -> None:
    components = {
        o["metadata"]["labels"].get("app.kubernetes.io/component") for o in external_objects
    }
    assert not components & {"postgresql", "redis", "minio"}
    secret = named(external_objects, "Secret", f"{FULLNAME}-secrets")["stringData"]
    assert secret["DLAAS_DATABASE_URL"] == EXTERNAL_VALUES["postgresql"]["url"]
    assert secret["DLAAS_BROKER_URL"] == EXTERNAL_VALUES["redis"]["url"]
    assert secret["DLAAS_S3_SECRET_KEY"] == "secret-example"
    assert secret["DLAAS_ADMIN_API_KEY"] == "admin-example"
    env = env_of(
        pod_spec(named(external_objects, "Deployment", f"{FULLNAME}-worker"))["containers"][0]
    )
    assert env["DLAAS_S3_ENDPOINT"]["value"] == "https://s3.us-east-1.amazonaws.com"
    assert env["DLAAS_S3_BUCKET"]["value"] == "acme-dlaas"
    assert env["DLAAS_K8S_IMAGE_PULL_SECRETS"]["value"] == "regcred"
    assert env["DLAAS_STORE_ROLE_ARN"]["value"] == EXTERNAL_VALUES["s3"]["roleArn"]
    assert env["DLAAS_STORE_SESSION_MAX_SECONDS"]["value"] == "3600"


def test_without_a_role_the_chart_sets_none(default_objects: list[dict[str, Any]]) -> None:
    env = env_of(
        pod_spec(named(default_objects, "Deployment", f"{FULLNAME}-worker"))["containers"][0]
    )
    assert "DLAAS_STORE_ROLE_ARN" not in env
    assert "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS" not in env  # so the backend refuses
    assert env["DLAAS_STORE_SESSION_MAX_SECONDS"]["value"] == "43200"


def test_platform_store_credentials_only_when_the_operator_says_so() -> None:
    objs = objects({"s3": {"allowPlatformStoreCredentials": True}})
    for component in ("worker", "monitor"):
        deployment = named(objs, "Deployment", f"{FULLNAME}-{component}")
        env = env_of(pod_spec(deployment)["containers"][0])
        assert env["DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS"]["value"] == "true"


@pytest.mark.parametrize(
    ("values", "prefix", "tag"),
    [(None, "dlaas/", "0.1.0"), (EXTERNAL_VALUES, "registry.acme.test/dlaas/", "1.2.3")],
)
def test_images_are_named_as_the_backend_names_them(
    values: dict[str, Any] | None, prefix: str, tag: str
) -> None:
    """The platform's pods run <prefix>platform:<tag>, the image the backend gives the
    learners' fetch and store steps; the learners' images share the prefix and tag."""
    objs = objects(values)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert tag == (values or {}).get("image", {}).get("tag", chart["appVersion"])
    for component, container in _containers(objs):
        assert container["image"] == f"{prefix}platform:{tag}", component
    env = env_of(pod_spec(named(objs, "Deployment", f"{FULLNAME}-worker"))["containers"][0])
    assert env["DLAAS_K8S_IMAGE_PREFIX"]["value"] == prefix
    assert env["DLAAS_K8S_IMAGE_TAG"]["value"] == tag
    pull = [{"name": n} for n in (values or {}).get("imagePullSecrets", [])]
    assert (
        pod_spec(named(objs, "Deployment", f"{FULLNAME}-api")).get("imagePullSecrets", []) == pull
    )


def test_an_external_service_without_its_address_is_refused() -> None:
    with pytest.raises(helm.HelmError, match=r"postgresql\.url is required"):
        render({"postgresql": {"bundled": False}})


def test_an_existing_secret_replaces_the_charts() -> None:
    objs = objects({**EXTERNAL_VALUES, "secrets": {"existingSecret": "dlaas-prod"}})
    assert [o for o in objs if o["kind"] == "Secret"] == []
    for _, container in _containers(objs):
        refs = {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env", [])
            if "valueFrom" in e
        }
        assert refs == {"dlaas-prod"}


def test_the_role_has_exactly_the_backends_rules(rendered: list[dict[str, Any]]) -> None:
    roles = [o for o in rendered if o["kind"] == "Role"]
    assert len(roles) == 1
    assert roles[0]["rules"] == EXPECTED_RULES
    # Cluster-wide, the nodes alone, read-only (admission packs learners onto them).
    (cluster_role,) = [o for o in rendered if o["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    (cluster_binding,) = [o for o in rendered if o["kind"] == "ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    # The backend's account, which the monitor runs as; the API's reads no node.
    assert cluster_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": BACKEND_SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]
    binding = named(rendered, "RoleBinding", f"{FULLNAME}-learners")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": roles[0]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": BACKEND_SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]


def test_each_service_account_has_exactly_its_rules(rendered: list[dict[str, Any]]) -> None:
    """The Roles bound to each service account, as a whole: the platform's components may
    do nothing through the API, the backend what EXPECTED_RULES says (no Secret read)."""
    accounts = {o["metadata"]["name"] for o in rendered if o["kind"] == "ServiceAccount"}
    assert accounts == set(SERVICE_ACCOUNT_RULES)
    roles = {o["metadata"]["name"]: o["rules"] for o in rendered if o["kind"] == "Role"}
    bound: dict[str, list[dict[str, Any]]] = {name: [] for name in accounts}
    for binding in (o for o in rendered if o["kind"] == "RoleBinding"):
        for subject in binding["subjects"]:
            bound[subject["name"]] += roles[binding["roleRef"]["name"]]
    assert bound == SERVICE_ACCOUNT_RULES
    for rule in bound[BACKEND_SERVICE_ACCOUNT]:
        if "secrets" in rule["resources"]:
            assert not {"get", "list", "watch"} & set(rule["verbs"])


def test_only_the_worker_and_the_monitor_hold_the_service_account_token(
    rendered: list[dict[str, Any]],
) -> None:
    for obj in rendered:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        if component in ("worker", "monitor"):
            assert spec["serviceAccountName"] == BACKEND_SERVICE_ACCOUNT
            assert spec["automountServiceAccountToken"] is True
        else:
            assert spec.get("serviceAccountName", "default") != BACKEND_SERVICE_ACCOUNT
            assert spec["automountServiceAccountToken"] is False, component


def test_worker_and_monitor_run_the_kubernetes_backend_in_the_release_namespace(
    rendered: list[dict[str, Any]],
) -> None:
    for component in ("worker", "monitor"):
        deployment = named(rendered, "Deployment", f"{FULLNAME}-{component}")
        env = env_of(pod_spec(deployment)["containers"][0])
        assert env["DLAAS_BACKEND"]["value"] == "kubernetes"
        assert env["DLAAS_K8S_NAMESPACE"]["value"] == NAMESPACE
        assert env["DLAAS_K8S_GPU_RESOURCE"]["value"] == "nvidia.com/gpu"
    assert named(rendered, "Deployment", f"{FULLNAME}-monitor")["spec"]["replicas"] == 1


def test_every_command_names_what_the_package_has(rendered: list[dict[str, Any]]) -> None:
    commands = {component: c["command"] for component, c in _containers(rendered)}
    assert set(commands) >= {*PLATFORM_COMPONENTS, "migrations"}
    assert commands["worker"] == ["python", "-m", "worker"]
    assert commands["monitor"] == ["python", "-m", "worker.monitor"]
    for component, argv in commands.items():
        if component in ("api", "worker", "monitor", "scoring", "migrations"):
            assert command_problems(argv) == [], component


def test_the_migrations_job_is_a_hook_before_pods_change(
    default_objects: list[dict[str, Any]], external_objects: list[dict[str, Any]]
) -> None:
    # The bundled database exists only once installed: the job follows the install.
    hooks = {
        "default": named(default_objects, "Job", f"{FULLNAME}-migrations"),
        "external": named(external_objects, "Job", f"{FULLNAME}-migrations"),
    }
    assert hooks["default"]["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    assert hooks["external"]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # Its Secret is a hook too, created before it.
    secret = named(external_objects, "Secret", f"{FULLNAME}-secrets")["metadata"]["annotations"]
    assert "pre-install" in secret["helm.sh/hook"]
    assert int(secret["helm.sh/hook-weight"]) < int(
        hooks["external"]["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    argv = pod_spec(hooks["external"])["containers"][0]["command"]
    assert "upgrade(" in argv[-1]
    # The pods do not migrate again when the job does.
    api = pod_spec(named(external_objects, "Deployment", f"{FULLNAME}-api"))["containers"][0]
    assert env_of(api)["DLAAS_AUTO_MIGRATE"]["value"] == "false"
    without = objects({**EXTERNAL_VALUES, "migrations": {"enabled": False}})
    assert not [o for o in without if o["kind"] == "Job"]
    api = pod_spec(named(without, "Deployment", f"{FULLNAME}-api"))["containers"][0]
    assert env_of(api)["DLAAS_AUTO_MIGRATE"]["value"] == "true"


def test_probes_ask_paths_the_apps_answer(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The probes' paths answer 200 without a key, on the real apps (on SQLite here)."""
    settings = Settings(home=tmp_path, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    apps = {"api": create_app, "scoring": create_scoring_app}
    checked = 0
    for component, container in _containers(rendered):
        if component not in apps:
            continue
        probes = {k: container[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")}
        assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        assert container["livenessProbe"]["httpGet"]["port"] == container["ports"][0]["name"]
        with TestClient(apps[component](settings)) as client:
            for path in probes.values():
                assert client.get(path).status_code == 200, (component, path)
        checked += 1
    assert checked >= 1


def test_pods_run_as_non_root_on_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            if component in ("postgresql", "minio"):
                continue  # their images write below their root
            assert security["readOnlyRootFilesystem"] is True, component
            if component in (*PLATFORM_COMPONENTS, "scoring", "migrations"):
                mounts = {m["mountPath"] for m in container["volumeMounts"]}
                home = env_of(container)["DLAAS_HOME"]["value"]
                assert "/tmp" in mounts
                assert any(home.startswith(m + "/") for m in mounts), component


def test_the_catalog_config_map_is_what_load_catalog_reads(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    config_map = named(rendered, "ConfigMap", f"{FULLNAME}-catalog")
    api = pod_spec(named(rendered, "Deployment", f"{FULLNAME}-api"))
    path = Path(env_of(api["containers"][0])["DLAAS_CATALOG_FILE"]["value"])
    mount = next(m for m in api["containers"][0]["volumeMounts"] if m["name"] == "catalog")
    volume = next(v for v in api["volumes"] if v["name"] == "catalog")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert path.parent == Path(mount["mountPath"])
    file = tmp_path / path.name
    file.write_text(config_map["data"][path.name])
    # Nothing given: the built-in catalog.
    assert load_catalog(file) == DEFAULT_CATALOG


def test_an_operators_catalog_reaches_the_config_map(tmp_path: Path) -> None:
    plans = {
        "team": {
            "distributed": True,
            "max_nodes": 4,
            "max_concurrent_trainings": 2,
            "predictions_per_minute": 600,
        }
    }
    config_map = named(objects({"catalog": {"plans": plans}}), "ConfigMap", f"{FULLNAME}-catalog")
    file = tmp_path / "catalog.yaml"
    file.write_text(config_map["data"]["catalog.yaml"])
    catalog = load_catalog(file)
    # The section replaces the built-in plans whole; the other sections stay built in.
    assert set(catalog.plans) == {"team"}
    assert catalog.plans["team"].max_nodes == 4
    assert catalog.compute_configurations == DEFAULT_CATALOG.compute_configurations


def test_every_setting_the_chart_sets_exists(rendered: list[dict[str, Any]]) -> None:
    known = {f"DLAAS_{name.upper()}" for name in Settings.model_fields} | K8S_SETTINGS
    for component, container in _containers(rendered):
        names = {n for n in env_of(container) if n.startswith("DLAAS_")}
        assert names <= known, (component, names - known)
    secrets = [o for o in rendered if o["kind"] == "Secret"]
    for secret in secrets:
        names = {n for n in secret["stringData"] if n.startswith("DLAAS_")}
        assert names <= known


def test_secret_references_name_keys_the_secret_has(rendered: list[dict[str, Any]]) -> None:
    secret = named(rendered, "Secret", f"{FULLNAME}-secrets")
    keys = set(secret["stringData"])
    for obj in rendered:
        if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        for container in pod_spec(obj)["containers"]:
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == secret["metadata"]["name"]
                    assert ref["key"] in keys, (obj["metadata"]["name"], ref["key"])


def test_scoring_and_ingress_when_enabled(external_objects: list[dict[str, Any]]) -> None:
    service = named(external_objects, "Service", f"{FULLNAME}-scoring")
    api = pod_spec(named(external_objects, "Deployment", f"{FULLNAME}-api"))["containers"][0]
    port = service["spec"]["ports"][0]["port"]
    assert env_of(api)["DLAAS_SCORING_URL"]["value"] == f"http://{FULLNAME}-scoring:{port}"
    ingress = named(external_objects, "Ingress", f"{FULLNAME}-api")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == f"{FULLNAME}-api"
    assert ingress["spec"]["tls"][0]["hosts"] == ["dlaas.acme.test"]


def test_services_select_their_pods(rendered: list[dict[str, Any]]) -> None:
    workloads = [o for o in rendered if o["kind"] in ("Deployment", "StatefulSet")]
    for service in (o for o in rendered if o["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        matched = [
            w for w in workloads if selector <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matched) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in pod_spec(matched[0])["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports


def test_notes_say_how_to_reach_the_api_and_create_a_tenant() -> None:
    notes = render()["dlaas/templates/NOTES.txt"]
    assert f"port-forward service/{FULLNAME}-api" in notes
    assert "dlaas tenants create" in notes
    assert "POST $DLAAS_URL/v1/tenants" in notes.replace("-X POST ", "POST ")
    assert f"secret {FULLNAME}-secrets" in notes


def test_notes_warn_that_the_backend_refuses_to_start_without_a_role() -> None:
    assert "s3.roleArn is empty" in render()["dlaas/templates/NOTES.txt"]
    allowed = render({"s3": {"allowPlatformStoreCredentials": True}})
    assert "s3.roleArn is empty" not in allowed["dlaas/templates/NOTES.txt"]
    assert "s3.roleArn is empty" not in render(EXTERNAL_VALUES)["dlaas/templates/NOTES.txt"]


# Free-form objects whose own fields are Kubernetes' or the catalog's (documented there).
_FREE_FORM = ("resources", "podSecurityContext", "containerSecurityContext", "plans")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):")


def test_every_value_is_documented_by_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    parents: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = _KEY.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if not any(p in _FREE_FORM for _, p in parents):
            above = lines[number - 1].strip() if number else ""
            if not above.startswith("#"):
                undocumented.append(f"{number + 1}: {line.strip()}")
        parents.append((indent, match["key"]))
    assert undocumented == []


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"postgresql": {"bundeld": False}}, "additional properties 'bundeld' not allowed"),
        ({"api": {"replicas": "two"}}, "/api/replicas"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"scoring": {"port": 70000}}, "/scoring/port"),
    ],
)
def test_values_the_schema_refuses(values: dict[str, Any], refusal: str) -> None:
    """values.schema.json: a misspelt or mistyped value fails the install instead of being
    ignored."""
    with pytest.raises(helm.HelmValuesError, match=re.escape(refusal)):
        render(values)


def _paths(tree: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    found = set()
    for key, value in tree.items():
        found.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            found |= _paths(value, sub, f"{prefix}{key}.")
    return found


def test_the_schema_describes_the_values_and_nothing_else() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def described(node: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, sub in node.get("properties", {}).items():
            out.add(prefix + key)
            out |= described(sub, f"{prefix}{key}.")
        return out

    assert described(schema) == _paths(values, schema)
