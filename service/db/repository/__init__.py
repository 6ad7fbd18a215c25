"""Every query the service runs, in one place: this package, one module per role.

- `database`: the readiness round trip and the monitor's leader lock.
- `tenants`: tenants, their API keys and the key revocation counter.
- `usage`: what a tenant holds against its plan (trainings by state, active learners,
  stored bytes, deployments).
- `submitting`: the statement that accepts a training, the plan's check and the inserts
  in one.
- `trainings`: trainings read whole, and what the monitor and admission ask every pass.
- `training_views`: trainings as the API shows them (`TrainingView`), and the list cursors.
- `deployments`: deployments, and how deploying ended.
- `versions`: a deployment's versions and labels.

Callers import the package (`from service.db import repository`); every public name of
the modules is re-exported here.
"""

from service.db.repository.database import (
    ping,
    try_advisory_lock,
)
from service.db.repository.deployments import (
    deployment_by_id,
    deployment_named,
    deployments_in_status,
    finish_deploying,
    get_deployment,
    list_deployments,
    note_deployment,
)
from service.db.repository.submitting import (
    PlanRoom,
    Usage,
    insert_within_plan,
)
from service.db.repository.tenants import (
    active_key_count,
    active_key_for_hash,
    bump_revocation_epoch,
    get_tenant,
    list_tenants,
    plans_of_queuing_tenants,
    plans_of_tenants,
    revocation_epoch,
    tenant_by_name,
    tenant_for_key_hash,
    tenant_key,
    tenant_keys,
    tenant_name_of,
    touch_key,
)
from service.db.repository.training_views import (
    TrainingView,
    decode_cursor,
    encode_cursor,
    list_training_views,
    training_manifest_and_learners,
    training_status,
    training_view,
)
from service.db.repository.trainings import (
    ActiveLoad,
    active_load,
    active_training_ids,
    active_trainings,
    active_trainings_among,
    get_training,
    queued_above,
    queued_candidates,
    queued_in_order,
    queued_trainings_among,
    set_queued_messages,
    starting_candidates,
    training_by_id,
    training_statuses,
    trainings_to_delete,
)
from service.db.repository.usage import (
    tenant_active_nodes,
    tenant_deployment_count,
    tenant_stored_bytes,
    tenant_training_count,
)
from service.db.repository.versions import (
    delete_label,
    deploying_versions,
    deployment_labels,
    deployment_version,
    deployment_versions,
    finish_version,
    labels_of,
    lock_deployment,
    note_version,
    serving_versions,
    set_label,
    versions_of,
)

__all__ = [
    "ActiveLoad",
    "PlanRoom",
    "TrainingView",
    "Usage",
    "active_key_count",
    "active_key_for_hash",
    "active_load",
    "active_training_ids",
    "active_trainings",
    "active_trainings_among",
    "bump_revocation_epoch",
    "decode_cursor",
    "delete_label",
    "deploying_versions",
    "deployment_by_id",
    "deployment_labels",
    "deployment_named",
    "deployment_version",
    "deployment_versions",
    "deployments_in_status",
    "encode_cursor",
    "finish_deploying",
    "finish_version",
    "get_deployment",
    "get_tenant",
    "get_training",
    "insert_within_plan",
    "labels_of",
    "list_deployments",
    "list_tenants",
    "list_training_views",
    "lock_deployment",
    "note_deployment",
    "note_version",
    "ping",
    "plans_of_queuing_tenants",
    "plans_of_tenants",
    "queued_above",
    "queued_candidates",
    "queued_in_order",
    "queued_trainings_among",
    "revocation_epoch",
    "serving_versions",
    "set_label",
    "set_queued_messages",
    "starting_candidates",
    "tenant_active_nodes",
    "tenant_by_name",
    "tenant_deployment_count",
    "tenant_for_key_hash",
    "tenant_key",
    "tenant_keys",
    "tenant_name_of",
    "tenant_stored_bytes",
    "tenant_training_count",
    "touch_key",
    "training_by_id",
    "training_manifest_and_learners",
    "training_status",
    "training_statuses",
    "training_view",
    "trainings_to_delete",
    "try_advisory_lock",
    "versions_of",
]
