"""Native TensorFlow: one learner, or a gRPC cluster of parameter servers and workers.

Learners 1..P are parameter servers (P = framework.parameter_servers, default 1, exported
as PS_HOSTS_COUNT), the rest workers. Every learner of a distributed training gets
TF_CONFIG (the cluster as host:port lists and its own task), so both styles work: the
seed documents' launcher scripts that build a ClusterSpec from LEARNER_* and port 2222,
and tf.distribute strategies. The training completes when every worker has exited 0;
parameter servers, which never exit on their own (server.join()), are then stopped.
"""

from __future__ import annotations

import json

from worker.launchers.plan import (
    Addressing,
    LaunchPlan,
    LearnerPlan,
    Role,
    TrainingSpec,
    base_env,
    learner_shell,
)


def plan_tensorflow(spec: TrainingSpec, addressing: Addressing) -> LaunchPlan:
    if spec.nodes == 1:
        learner = LearnerPlan(
            learner_id=1,
            hostname=addressing.hostnames[0],
            role=Role.SINGLE,
            primary=True,
            argv=learner_shell(spec.command),
            env=base_env(spec, addressing, 1),
        )
        return LaunchPlan(spec.training_id, (learner,), conventions=spec.conventions)

    ps = spec.parameter_servers
    cluster: dict[str, list[str]] = {}
    if ps:
        cluster["ps"] = [addressing.endpoint(i) for i in range(1, ps + 1)]
    cluster["worker"] = [addressing.endpoint(i) for i in range(ps + 1, spec.nodes + 1)]
    learners = []
    for i in range(1, spec.nodes + 1):
        is_ps = i <= ps
        task = {"type": "ps", "index": i - 1} if is_ps else {"type": "worker", "index": i - ps - 1}
        env = base_env(spec, addressing, i)
        env["PS_HOSTS_COUNT"] = str(ps)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task}, separators=(",", ":"))
        learners.append(
            LearnerPlan(
                learner_id=i,
                hostname=addressing.hostnames[i - 1],
                role=Role.PARAMETER_SERVER if is_ps else Role.WORKER,
                primary=not is_ps,
                argv=learner_shell(spec.command),
                env=env,
            )
        )
    return LaunchPlan(spec.training_id, tuple(learners), conventions=spec.conventions)
