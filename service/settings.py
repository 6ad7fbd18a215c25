"""All configuration, from `DLAAS_*` environment variables.

Unset means the embedded default: everything lives under `DLAAS_HOME` (SQLite, a local
object-store directory, learner work directories) and no server has to be installed.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.domain import egress
from service.domain.names import is_dns_subdomain, is_label_key


class Settings(BaseSettings):
    """One settings object for the API, the worker and the CLI's embedded server."""

    model_config = SettingsConfigDict(env_prefix="DLAAS_", extra="ignore")

    home: Path = Field(
        default=Path("~/.dlaas"),
        description="State of the embedded platform: SQLite file, object store, work dirs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default SQLite under DLAAS_HOME, "
        "postgresql+psycopg://... in a cluster.",
    )
    admin_api_key: str | None = Field(
        default=None,
        description="Bootstrap admin key; generated into $DLAAS_HOME/admin_api_key if unset.",
    )
    catalog_file: Path | None = Field(
        default=None,
        description="YAML file overriding the framework, compute and plan catalogs.",
    )
    runtimes_dir: Path | None = Field(
        default=None,
        description="Where `dlaas runtimes install` builds the framework runtimes (one Python "
        "environment each) and learners find them; default $DLAAS_HOME/runtimes. A shared "
        "directory lets several installations (or test runs) use one build.",
    )
    runtime_definitions_dir: Path | None = Field(
        default=None,
        description="The runtime definitions (NAME.txt pinned requirements, and the local "
        "packages they name); default: the runtimes/ directory of this installation's source.",
    )
    runtime_auto_install: bool = Field(
        default=False,
        description="Install a training's runtime when a training first needs it, instead of "
        "refusing the submission: the training waits in PENDING with the install's progress "
        "in its status_message (the Horovod runtime takes minutes to build). `dlaas up` "
        "sets it to true unless it is set.",
    )
    max_upload_bytes: int = Field(
        default=200 * 1024 * 1024,
        gt=0,
        description="Largest training upload (413 above).",
    )
    max_json_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        description="Largest body of every other request (JSON documents; 413 above).",
    )
    max_prediction_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="Largest body of a prediction request (413 above).",
    )
    auth_failures_per_minute: int = Field(
        default=120,
        gt=0,
        description="Requests with a missing or wrong API key one client address may make a "
        "minute (a bucket of that many, refilled over a minute); past it the address's "
        "requests with a key not already known are answered 429 before the key is looked up.",
    )
    rate_limit_pause_seconds: float = Field(
        default=1.0,
        ge=0,
        description="How long a request refused for a request rate (429) waits before its "
        "answer, holding no thread: a client that waits for each answer then floods at one "
        "request per connection per pause (at most 1,024 refusals wait at once per process).",
    )
    max_log_followers_per_tenant: int = Field(
        default=8,
        gt=0,
        description="Training logs one tenant may follow (follow=true) at once, counted per "
        "API process (429 above).",
    )
    archive_max_files: int = Field(default=10_000, gt=0)
    archive_max_unpacked_bytes: int = Field(default=2 * 1024**3, gt=0)
    auto_migrate: bool = Field(
        default=True, description="Run database migrations when the API starts."
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker; default a directory under DLAAS_HOME (no server), "
        "redis://... in a cluster.",
    )
    log_store_url: str | None = Field(
        default=None,
        description="redis://... for live logs shared across machines; default the broker "
        "if it is Redis, else files under DLAAS_HOME.",
    )
    backend: Literal["local", "kubernetes"] = Field(
        default="local", description="Where learners run."
    )
    k8s_namespace: str = Field(
        default="dlaas",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Kubernetes backend: the namespace learners' pods, Services and Secrets "
        "are created in (the platform's own, in the Helm chart).",
    )
    k8s_image_prefix: str = Field(
        default="ghcr.io/dlaas/",
        description="Kubernetes backend: registry and path the images are named under; the "
        "learner image of runtime R is {prefix}learner-R:{tag}, the platform's (fetch and "
        "store, beside the learner) {prefix}platform:{tag}.",
    )
    k8s_image_tag: str = Field(
        default="latest",
        min_length=1,
        description="Kubernetes backend: the tag of the learner and platform images; pin it "
        "to the platform's release in a cluster (the Helm chart does).",
    )
    k8s_image_pull_secrets: str = Field(
        default="",
        description="Kubernetes backend: comma-separated names of Secrets (in the namespace) "
        "the kubelet pulls the images with; empty: none.",
    )
    k8s_gpu_resource: str = Field(
        default="nvidia.com/gpu",
        min_length=1,
        description="Kubernetes backend: the extended resource a learner's GPUs are requested "
        "as (the device plugin's).",
    )
    k8s_cluster_domain: str = Field(
        default="cluster.local",
        min_length=1,
        description="Kubernetes backend: the cluster's DNS domain, in the learners' DNS search "
        "path (<prefix>.<namespace>.svc.<domain>).",
    )
    k8s_pod_ttl_seconds: int = Field(
        default=0,
        ge=0,
        description="Kubernetes backend: seconds a training's pods are kept after it reached "
        "a terminal state, for debugging; 0: deleted at once.",
    )
    k8s_image_pull_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Kubernetes backend: seconds a learner's pod may wait for an image it "
        "cannot pull (ErrImagePull, ImagePullBackOff) before the learner fails naming it.",
    )
    k8s_slots: int = Field(
        default=1000,
        gt=0,
        description="Kubernetes backend: learners admitted at once where admission does not "
        "read the nodes (DLAAS_K8S_GANG set, or the nodes cannot be listed).",
    )
    k8s_capacity_sync_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Kubernetes backend: seconds admission waits for the first list of the "
        "cluster's nodes; nodes that cannot be read leave admission to DLAAS_K8S_SLOTS.",
    )
    # -- Kubernetes gang scheduling (worker.backends.kubernetes.gang) --
    k8s_gang: Literal["none", "kueue", "coscheduling"] = Field(
        default="none",
        description="Kubernetes backend: who starts a training's learners together. none: the "
        "platform's own admission (a training only when all of its learners fit the nodes "
        "now); kueue: the pods form one Kueue pod group (Kueue admits "
        "them, the platform's admission steps aside); coscheduling: a scheduler-plugins "
        "PodGroup (minMember = learners) and the pods name its scheduler.",
    )
    k8s_kueue_queue: str = Field(
        default="dlaas",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Kubernetes backend with DLAAS_K8S_GANG=kueue: the LocalQueue (in the "
        "namespace) the learners' pod groups are submitted to.",
    )
    k8s_scheduler_name: str = Field(
        default="scheduler-plugins-scheduler",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
        description="Kubernetes backend with DLAAS_K8S_GANG=coscheduling: the scheduler the "
        "learners' pods name (scheduler-plugins' with the coscheduling plugin).",
    )
    k8s_unschedulable_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Kubernetes backend: seconds a learner's pod may stay unschedulable while "
        "its training's learners have not all started; past that the whole gang is released "
        "and the training queued again, once, then failed.",
    )
    # -- Kubernetes backend: each training's NetworkPolicy (service/domain/egress.py).
    k8s_network_policy: bool = Field(
        default=True,
        description="Kubernetes backend: create a NetworkPolicy with each training: its "
        "pods reach only each other, the cluster's DNS and the egress below.",
    )
    k8s_egress_cidrs: str = Field(
        default="",
        description="Kubernetes backend: comma-separated CIDRs learners' pods may connect "
        "to (the store's and the log store's addresses outside the cluster); the metadata "
        "address and DLAAS_K8S_EGRESS_DENIED_CIDRS are excepted from each.",
    )
    k8s_egress_pods: str = Field(
        default="",
        description="Kubernetes backend: ';'-separated [NAMESPACE:]KEY=VALUE[,KEY=VALUE] "
        "label selectors of pods learners' pods may connect to (a store or Redis in the "
        "cluster); without NAMESPACE: in DLAAS_K8S_NAMESPACE.",
    )
    k8s_egress_ports: str = Field(
        default="",
        description="Kubernetes backend: comma-separated TCP ports of that egress; empty: "
        "any port.",
    )
    k8s_egress_denied_cidrs: str = Field(
        default="",
        description="Kubernetes backend: comma-separated CIDRs never reachable from "
        "learners' pods, excepted from every egress CIDR that contains them (the cluster's "
        "pod and Service ranges, where the platform's own Services are); the metadata "
        "address 169.254.169.254 always is.",
    )
    local_slots: int = Field(
        default=8, gt=0, description="Learners the local backend runs at once (gang admission)."
    )
    local_namespaces: bool | None = Field(
        default=None,
        description="Give each local learner its own network namespace; unset: when available.",
    )
    local_sandbox: bool | None = Field(
        default=None,
        description="Run local learners' commands in a bubblewrap sandbox; unset: when bwrap "
        "works here.",
    )
    allow_unsandboxed: bool = Field(
        default=False,
        description="Run tenants' code without a sandbox where none can be made (a one-user "
        "machine): trainings and models. Without it, only the `local` tenant's trainings start "
        "unsandboxed, and models do not deploy.",
    )
    monitor_interval: float = Field(
        default=0.25,
        gt=0,
        description="Seconds between two passes of the monitor. It is also woken at once by "
        "learners' status changes (local backend) and by the API in the same process. On "
        "PostgreSQL also how far behind the database an API process's kept training bodies "
        "may be (service.api.training_views).",
    )
    monitor_full_pass_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two full passes of the monitor on a backend that says "
        "which trainings changed (Kubernetes: its pod watch). The passes between reconcile "
        "only those and the trainings written since the last pass; a full pass reconciles "
        "every active training (timeouts, lost launches, missing pods).",
    )
    stop_grace_seconds: float = Field(
        default=3.0, ge=0, description="SIGTERM to SIGKILL grace when learners are stopped."
    )
    store_retry_attempts: int = Field(
        default=5,
        gt=0,
        description="Attempts a learner makes to upload each of its results and logs to an "
        "object store that is unreachable, with exponential backoff between them, before it "
        "fails the training naming the store.",
    )
    store_retry_seconds: float = Field(
        default=30.0,
        gt=0,
        description="The most seconds a learner keeps retrying one upload to an unreachable "
        "object store (DLAAS_STORE_RETRY_ATTEMPTS: whichever ends first).",
    )
    log_dir_sync_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two syncs of a running learner's LOG_DIR to the object "
        "store (its new and changed files only), and between two reads of its TensorBoard "
        "event files for a training whose evaluation_metrics are `{type: tensorboard}`.",
    )
    scoring_url: str | None = Field(
        default=None,
        description="URL of a separate scoring service (`python -m service.scoring`) that the "
        "API forwards predictions to; unset: the API process scores (embedded).",
    )
    scoring_grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve TensorFlow Serving's gRPC API (tensorflow.serving.PredictionService: "
        "Predict, GetModelMetadata) on this port, wherever predictions are scored (the API "
        "process, or `python -m service.scoring`); 0: a port the system chooses (logged); "
        "unset: no gRPC API.",
    )
    scoring_grpc_front: Literal["auto", "native", "python"] = Field(
        default="auto",
        description="What serves the scoring gRPC port's transport: `native`, the "
        "dlaas-grpc-front program `make install` builds (HTTP/2 outside Python; every check "
        "and answer stays in this process); `python`, grpcio's asyncio server in this "
        "process; `auto`, native where the program is installed, else python.",
    )
    scoring_grpc_host: str = Field(
        default="127.0.0.1",
        description="The address the scoring gRPC API listens on (0.0.0.0 or [::] for every "
        "interface, as a separate scoring service in a cluster needs).",
    )
    scoring_batching: bool = Field(
        default=True, description="Merge concurrent prediction requests into one model call."
    )
    scoring_max_batch_size: int = Field(
        default=256, gt=0, description="Most instances in one batched model call."
    )
    scoring_max_wait_ms: float = Field(
        default=2.0, ge=0, description="How long a batch waits for more requests to join it."
    )
    scoring_threads: int | None = Field(
        default=None,
        gt=0,
        description="Model calls that run at once per deployment (unset: 1 with batching, "
        "2 without).",
    )
    scoring_call_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a model call may take; past it the deployment's model process is "
        "restarted and its waiting predictions answered 503.",
    )
    scoring_poll_interval: float = Field(
        default=2.0, gt=0, description="Seconds between two looks for deployments to load."
    )
    scoring_rate_limit_url: str | None = Field(
        default=None,
        description="redis://... for prediction rate limits shared by scoring replicas; "
        "default the broker if it is Redis, else counted in the scoring process.",
    )
    s3_endpoint: str | None = Field(
        default=None,
        description="e.g. http://127.0.0.1:9000; when set, the platform's object store is this "
        "S3 endpoint instead of the directory under DLAAS_HOME.",
    )
    s3_access_key: str | None = Field(default=None, description="Access key of DLAAS_S3_*.")
    s3_secret_key: SecretStr | None = Field(default=None, description="Its secret key.")
    s3_bucket: str = Field(default="dlaas", description="The platform's bucket (created).")
    s3_region: str | None = Field(default=None, description="Region; default us-east-1.")
    store_role_arn: str | None = Field(
        default=None,
        description="Kubernetes backend: the role learners' store credentials are assumed "
        "from (STS AssumeRole at the S3 endpoint, with a session policy allowing only the "
        "training's own keys); unset: learners get the platform's credentials, unscoped.",
    )
    k8s_allow_platform_store_credentials: bool = Field(
        default=False,
        description="Kubernetes backend: start without DLAAS_STORE_ROLE_ARN, giving learner "
        "pods the platform's own store credentials (the whole bucket); unset, the backend "
        "refuses to start without a role.",
    )
    store_session_max_seconds: int = Field(
        default=43200,
        ge=900,
        le=43200,
        description="The longest session asked of STS for a training's credentials (its "
        "max_runtime plus a margin, at most this; at most the role's MaxSessionDuration).",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="Encrypts data-store credentials at rest; default a key generated into "
        "$DLAAS_HOME/secret_key. Set the same value everywhere in a cluster.",
    )
    session_max_age: int = Field(
        default=43200,
        ge=60,
        description="Seconds a dashboard sign-in (its session cookie) lasts before the "
        "dashboard asks for the API key again.",
    )
    ui_assets_dir: Path | None = Field(
        default=None,
        description="Where the dashboard's front-end libraries were installed (the "
        "node_modules directory `make ui-assets` fills); default the source's node_modules.",
    )
    allowed_data_endpoints: str | None = Field(
        default=None,
        description="Comma-separated host[:port], *.domain or scheme://host[:port] entries "
        "that users' data and results endpoints may name, besides the platform's own S3 "
        "endpoint (always allowed); default: none other, on one machine as in a cluster. "
        "Set the same value on the API and the workers.",
    )

    @field_validator("k8s_gpu_resource")
    @classmethod
    def _extended_resource(cls, value: str) -> str:
        if "/" not in value or not is_label_key(value):
            raise ValueError(f"'{value}' is not an extended resource name (domain/name)")
        return value

    @field_validator("k8s_image_pull_secrets")
    @classmethod
    def _secret_names(cls, value: str) -> str:
        for name in (n.strip() for n in value.split(",")):
            if name and not is_dns_subdomain(name):
                raise ValueError(f"'{name}' is not a Secret name")
        return value

    @field_validator("k8s_egress_cidrs")
    @classmethod
    def _cidrs(cls, value: str) -> str:
        egress.parse_cidrs(value)
        return value

    @field_validator("k8s_egress_denied_cidrs")
    @classmethod
    def _denied_cidrs(cls, value: str) -> str:
        egress.parse_cidrs(value, "denied range")
        return value

    @field_validator("k8s_egress_pods")
    @classmethod
    def _pod_peers(cls, value: str) -> str:
        egress.parse_pod_peers(value)
        return value

    @field_validator("k8s_egress_ports")
    @classmethod
    def _ports(cls, value: str) -> str:
        egress.parse_ports(value)
        return value

    @model_validator(mode="after")
    def _egress_outside_denied(self) -> Settings:
        _ = self.k8s_egress_rules  # an egress CIDR inside a denied range is refused
        return self

    @property
    def k8s_egress_rules(self) -> egress.EgressRules:
        """DLAAS_K8S_EGRESS_*: what each training's NetworkPolicy lets its pods reach."""
        return egress.EgressRules(
            cidrs=egress.parse_cidrs(self.k8s_egress_cidrs),
            pods=egress.parse_pod_peers(self.k8s_egress_pods),
            ports=egress.parse_ports(self.k8s_egress_ports),
            denied=egress.parse_cidrs(self.k8s_egress_denied_cidrs, "denied range"),
        )

    @cached_property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home_dir / 'dlaas.db'}"

    @property
    def object_store_dir(self) -> Path:
        return self.home_dir / "objects"

    @property
    def runtimes_path(self) -> Path:
        if self.runtimes_dir is not None:
            return self.runtimes_dir.expanduser().resolve()
        return self.home_dir / "runtimes"

    @property
    def work_dir(self) -> Path:
        return self.home_dir / "work"

    @property
    def k8s_pull_secret_names(self) -> tuple[str, ...]:
        """DLAAS_K8S_IMAGE_PULL_SECRETS as names, blanks dropped."""
        return tuple(n.strip() for n in self.k8s_image_pull_secrets.split(",") if n.strip())

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "dlaas-filesystem://"

    @property
    def resolved_log_store_url(self) -> str | None:
        """A Redis URL, or None for the file store under DLAAS_HOME."""
        if self.log_store_url:
            return self.log_store_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None

    @property
    def resolved_scoring_threads(self) -> int:
        """Model calls at once per deployment. With batching, one: TensorFlow and ONNX
        Runtime spread a call over the cores themselves, a second call in the same model
        process only contends with it for them (and for its interpreter), and the requests
        queued behind the running call share the next one. Without batching, two, so that
        one request's call does not hold up the next."""
        if self.scoring_threads is not None:
            return self.scoring_threads
        return 1 if self.scoring_batching else 2

    @property
    def resolved_rate_limit_url(self) -> str | None:
        """A Redis URL for prediction rate limits, or None to count in the process."""
        if self.scoring_rate_limit_url:
            return self.scoring_rate_limit_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None

    @property
    def scoring_dir(self) -> Path:
        """Where deployed models are unpacked for the scoring process that serves them."""
        return self.home_dir / "scoring"

    @property
    def admin_key_file(self) -> Path:
        return self.home_dir / "admin_api_key"

    @property
    def secret_key_file(self) -> Path:
        return self.home_dir / "secret_key"
