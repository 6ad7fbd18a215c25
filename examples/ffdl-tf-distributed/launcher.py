#!/usr/bin/env python
"""A launcher in the manner of FfDL's tf-distributed example, for FfDL's conventions.

Every learner runs `./launcher.py <command...>`. The launcher works out the learner's role
from FfDL's variables and runs the command with the classic distributed-TensorFlow flags:

- learner i (LEARNER_ID, from 1) is host `$LEARNER_NAME_PREFIX-<i-1>.$LEARNER_NAME_PREFIX`
  (FfDL numbers hosts from 0), port 2222;
- the first PS_HOSTS_COUNT learners (default 1) are parameter servers, the rest workers;
- task_index = LEARNER_ID - 1 for a parameter server, LEARNER_ID - 1 - PS_HOSTS_COUNT for
  a worker.

It reads no TF_CONFIG: it works only where learners are named as FfDL names them.
"""

import os
import subprocess
import sys


def main() -> int:
    learners = int(os.environ["NUM_LEARNERS"])
    prefix = os.environ["LEARNER_NAME_PREFIX"]
    ps_count = int(os.environ.get("PS_HOSTS_COUNT", "1"))
    learner_id = int(os.environ["LEARNER_ID"])

    hosts = [f"{prefix}-{i}.{prefix}:2222" for i in range(learners)]
    job = "ps" if learner_id <= ps_count else "worker"
    task_index = learner_id - 1 if job == "ps" else learner_id - 1 - ps_count

    command = [
        *sys.argv[1:],
        f"--job_name={job}",
        f"--ps_hosts={','.join(hosts[:ps_count])}",
        f"--worker_hosts={','.join(hosts[ps_count:])}",
        f"--task_index={task_index}",
    ]
    print(f"launching learner {learner_id} as {job} {task_index}: {' '.join(command)}", flush=True)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout is not None
    for line in child.stdout:
        print(line.decode("utf-8", "replace").rstrip("\n"), flush=True)
    code = child.wait()
    if code != 0:
        print(f"command {command[0]} exited with code {code}", flush=True)
    return 1 if code else 0


if __name__ == "__main__":
    sys.exit(main())
