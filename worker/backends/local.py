"""The local backend: this machine as a small cluster, one process tree per learner.

Every learner is a learner wrapper (`python -I ... worker.learner SPEC HOST`, see
`wrapper_argv`) in its own session, so it outlives the worker that started it: a worker
killed mid-training is simply restarted, and the monitor keeps observing the learners
through their status files. The wrapper (trusted: it fetches and stores with the
credentials) runs outside, from the learner's private directory; the user's command runs
inside the learner's network and UTS namespaces (worker.backends.netns), so every learner
is reachable as `$LEARNER_NAME_PREFIX-$LEARNER_ID` and can serve port 2222, as in a pod,
and there inside a sandbox (service.sandbox: bubblewrap) that shows it only the system,
the runtime and its own training's directories. Where namespaces are unavailable the
learners share the loopback on distinct ports (carried in TF_CONFIG); where no sandbox can
be made the commands run unsandboxed (only the local tenant's, unless
DLAAS_ALLOW_UNSANDBOXED); the training's status says so.

MPI jobs (Horovod, DDL; worker.backends.local_mpi says what runs where): with learner
namespaces and a sandbox, `mpirun` is learner 1's command, in its sandbox; its daemons
start in the other learners' sandboxes through the relay that learner 1's wrapper serves
(worker.learner.mpi_relay), and every rank's prefix (worker.learner.rank) runs in its
sandbox as a file of the standard library. Otherwise mpirun and the prefix are the
platform's processes outside any sandbox, started from `/`, never MODEL_DIR. Every Python
the platform itself starts near a tenant's files starts isolated
(service.sandbox.isolated: `python -I`, its source root named), so no module a tenant
wrote (MODEL_DIR, HOME's user site, PYTHONPATH) is on its path
(tests/security/test_shadow_modules.py).

Layout under DLAAS_HOME/work/<training id>/: state.json (what was started),
net/ (the learner network), results/ (RESULT_DIR, shared by all learners), rendezvous/,
hostfile, ranks.json and mpi-agent (MPI, read-only in the sandboxes), mpi/ (the MPI
session directory, TMPDIR of mpirun), mpi-relay/ (the relay's socket),
learner-<i>/ (private: spec.json, host.json, status.json, training-log.txt, wrapper.log;
and the sandbox's model/, data/, logs/, home/), checkpoints/ (CHECKPOINT_DIR, shared by
the learners: restored from the last attempt's before they start, saved by the worker
once they are stopped). Cleanup removes it all once the results are stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from service import sandbox
from service.runtimes import RuntimeInfo
from service.sandbox import limits
from service.sandbox.isolated import python_argv
from service.sandbox.limits import Enforcement, ResourceLimits
from service.storage import open_store
from service.storage.base import ObjectStore, check_key
from service.tenantfs import TenantDir, tree
from worker.backends import local_learners, local_mpi
from worker.backends.base import Observation, StartRequest
from worker.backends.base import learner_spec as backend_learner_spec
from worker.backends.netns import LearnerNetwork, namespaces_available
from worker.launchers import plan_launch
from worker.launchers.plan import (
    Addressing,
    LaunchPlan,
    Role,
    convention_directories,
    first_host_index,
    learner_name_prefix,
)
from worker.learner.host import LocalHost

log = logging.getLogger(__name__)

_FALLBACK_NOTE = (
    "learner namespaces are unavailable here ({why}); learners share 127.0.0.1 on distinct "
    "ports (see TF_CONFIG) and their host names do not resolve"
)
_UNSANDBOXED_NOTE = "the learners' commands run without a sandbox here ({why})"
_GIB = 1024**3


def wrapper_argv(spec_path: Path, host_path: Path) -> list[str]:
    """The learner wrapper's command: the platform's Python, isolated (no working
    directory, environment or user site directory on its path), from its own source."""
    return python_argv("worker.learner", str(spec_path), str(host_path))


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are free now (fallback mode)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first: int = s.getsockname()[1]
        if first + count < 65535 and all(_port_free(first + i) for i in range(count)):
            return first
    raise RuntimeError("no free block of local ports for the learners")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LocalBackend:
    def __init__(
        self,
        work_root: Path,
        *,
        slots: int = 8,
        stop_grace_seconds: float = 3.0,
        use_namespaces: bool | None = None,
        use_sandbox: bool | None = None,
        hidden: tuple[Path, ...] = (),
        store_attempts: int = 5,
        store_retry_seconds: float = 30.0,
    ) -> None:
        self.work_root = work_root
        # How patiently learners store their results to an unreachable store (the spec's).
        self.store_attempts = store_attempts
        self.store_retry_seconds = store_retry_seconds
        self._slots = slots
        self.stop_grace_seconds = stop_grace_seconds
        if use_namespaces is None:
            use_namespaces, self.namespaces_missing = namespaces_available()
        else:
            self.namespaces_missing = "" if use_namespaces else "disabled by configuration"
        self.use_namespaces = use_namespaces
        self.bwrap: str | None = None
        if use_sandbox is False:
            self.sandbox_missing = "disabled by configuration"
        else:
            support = sandbox.probe()
            self.bwrap, self.sandbox_missing = support.bwrap, support.why
        # What no sandbox may show (DLAAS_HOME, the work root), even where a read-only
        # system directory holds it.
        self.hidden = tuple(str(p) for p in (*hidden, work_root))
        self.cgroup_root = limits.machine_cgroup()

    def unsandboxed_reason(self) -> str | None:
        """None when learners' commands run in a sandbox; else why they cannot."""
        return None if self.bwrap else self.sandbox_missing

    def slots(self) -> int:
        return self._slots

    @property
    def notify_path(self) -> Path:
        """The socket learners' wrappers tell the monitor about status changes on."""
        return self.work_root / "monitor.sock"

    @contextlib.contextmanager
    def changes(self, wake: Callable[[], None]) -> Iterator[None]:
        """Listen on notify_path: each datagram (a learner's status changed) calls `wake`."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.work_root.mkdir(parents=True, exist_ok=True)
            self.notify_path.unlink(missing_ok=True)
            sock.bind(str(self.notify_path))
        except OSError as e:  # e.g. a path over the 107 bytes of a socket address
            sock.close()
            log.warning("learners cannot notify the monitor (%s); it polls instead", e)
            yield
            return
        stopping = threading.Event()

        def listen() -> None:
            while True:
                try:
                    sock.recv(256)
                except OSError:
                    return
                if stopping.is_set():
                    return
                wake()

        listener = threading.Thread(target=listen, name="learner-changes", daemon=True)
        listener.start()
        try:
            yield
        finally:
            stopping.set()
            # Wake the listener up, to see that it is over.
            with (
                contextlib.suppress(OSError),
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as poke,
            ):
                poke.sendto(b"", str(self.notify_path))
            listener.join(2)
            sock.close()
            self.notify_path.unlink(missing_ok=True)

    def _dir(self, training_id: str) -> Path:
        return self.work_root / training_id

    # -- start ---------------------------------------------------------------------------

    def start(self, request: StartRequest) -> None:
        spec = request.spec
        tdir = self._dir(spec.training_id)
        tdir.mkdir(parents=True, exist_ok=True)
        state_file = tdir / "state.json"
        state = local_learners.read_json(state_file)
        if state is None:
            state = self._prepare(request, tdir)
            if request.restore_checkpoints is not None:
                self._restore_checkpoints(request, tdir / "checkpoints")
            local_learners.write_json(state_file, state)
        # Spawn what was not spawned yet: a launch delivered twice, or after a worker died
        # halfway, never starts a learner twice. A worker killed between spawning a learner
        # and recording it left that learner running (or ended): it is recorded, not
        # started again.
        for learner in state["learners"]:
            if learner["spawned_at"] is None:
                spec_path = Path(learner["spec"])
                if not local_learners.wrapper_started(spec_path):
                    self._spawn(spec_path)
                learner["spawned_at"] = time.time()
                local_learners.write_json(state_file, state)

    def _prepare(self, request: StartRequest, tdir: Path) -> dict[str, Any]:
        spec = request.spec
        prefix = learner_name_prefix(spec.training_id)
        notes: list[str] = []
        net: LearnerNetwork | None = None
        first = first_host_index(spec.conventions)
        if self.use_namespaces:
            addressing = Addressing.per_learner_hosts(prefix, spec.nodes, first)
            net = LearnerNetwork.attach(tdir / "net") or LearnerNetwork.create(
                spec.training_id, list(addressing.hostnames), tdir / "net"
            )
        else:
            addressing = Addressing.shared_loopback(
                prefix, spec.nodes, _free_ports(spec.nodes), first
            )
            notes.append(_FALLBACK_NOTE.format(why=self.namespaces_missing))

        mpi = None
        # MPI: mpirun and its daemons in the learners' sandboxes, through the relay
        # (worker.backends.local_mpi), wherever learners have namespaces and a sandbox.
        relayed = spec.distribution == "mpi" and net is not None and self.bwrap is not None
        if spec.distribution == "mpi":
            mpi = local_mpi.mpi_setup(tdir, net, request.runtime, relayed=relayed)
        plan = plan_launch(spec, addressing, mpi)
        results = tdir / "results"
        checkpoints = tdir / "checkpoints"
        rendezvous = tdir / "rendezvous"
        mpi_session = tdir / "mpi"
        for d in (results, checkpoints, rendezvous):
            d.mkdir(parents=True, exist_ok=True)
        if mpi is not None:
            mpi_session.mkdir(exist_ok=True)
        learners_env = self._learner_envs(plan, tdir, results, checkpoints)
        if self.bwrap is None:
            notes.append(_UNSANDBOXED_NOTE.format(why=self.sandbox_missing))
        enforcements: dict[int, Enforcement] = {}
        sandboxes: dict[int, list[str]] = {}
        for lp in plan.learners:
            enforcement, limit_notes = limits.plan(
                ResourceLimits(
                    memory_bytes=spec.memory_gib * _GIB if spec.memory_gib else None,
                    cpus=spec.cpus or None,
                ),
                f"{spec.training_id}-{lp.learner_id}",
                cgroup_root=self.cgroup_root,
                cpus_available=tuple(sorted(os.sched_getaffinity(0))),
                slot=lp.learner_id - 1,
            )
            notes.extend(n for n in limit_notes if n not in notes)
            enforcements[lp.learner_id] = enforcement
            readonly, writable = (
                local_mpi.sandbox_files(tdir, lp, relayed=relayed) if mpi is not None else ([], [])
            )
            sandboxes[lp.learner_id] = self._sandbox_argv(
                learners_env[lp.learner_id], tuple(writable), request.runtime, tuple(readonly)
            )
        envs = {
            lp.learner_id: {
                **self._runtime_env(request.runtime),
                **lp.env,
                **learners_env[lp.learner_id],
                **({"TMPDIR": str(mpi_session)} if mpi is not None else {}),
            }
            for lp in plan.learners
        }
        mpi_relay: dict[str, Any] | None = None
        if plan.hostfile is not None:
            hostfile = plan.hostfile if net else f"localhost slots={spec.nodes}\n"
            (tdir / "hostfile").write_text(hostfile)
            per_learner = {
                lp.learner_id: local_mpi.rank_entry(
                    lp,
                    tdir,
                    learners_env[lp.learner_id],
                    sandboxes[lp.learner_id],
                    enforcements[lp.learner_id],
                    relayed=relayed,
                )
                for lp in plan.learners
            }
            ranks: dict[str, Any] = {
                "hosts": {lp.hostname: per_learner[lp.learner_id] for lp in plan.learners},
                "by_rank": {
                    str(lp.learner_id - 1): per_learner[lp.learner_id] for lp in plan.learners
                },
            }
            local_learners.write_json(tdir / "ranks.json", ranks)
            if relayed:
                assert net is not None
                for lp in plan.learners:
                    if lp.role == Role.MPI_HOST:  # bound into its sandbox: it must exist
                        output = local_mpi.rank_output(tdir, lp.learner_id)
                        output.parent.mkdir(parents=True, exist_ok=True)
                        os.close(os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
                hosts = local_mpi.relay_hosts(net, plan.learners, envs, sandboxes, enforcements)
                mpi_relay = {"directory": str(local_mpi.relay_dir(tdir)), "hosts": hosts}

        learners = []
        for lp in plan.learners:
            ldir = tdir / f"learner-{lp.learner_id}"
            ldir.mkdir(parents=True, exist_ok=True)
            ldir.chmod(0o700)
            env = dict(envs[lp.learner_id])
            if mpi is None or lp.role != Role.MPI_LAUNCHER:
                env.pop("TMPDIR", None)  # the MPI session directory: mpirun's TMPDIR
            Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
            # The platform's own learners: an MPI host's relay of its ranks' output, and
            # mpirun where it cannot run in a sandbox (worker.backends.local_mpi).
            platform_run = lp.role == Role.MPI_HOST or (
                lp.role == Role.MPI_LAUNCHER and not relayed
            )
            if lp.role == Role.MPI_HOST:
                # The host's output is what its ranks write (worker.learner.rank): relayed
                # from the start of the file for as long as the learner runs.
                output = local_mpi.rank_output(tdir, lp.learner_id)
                os.close(os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
                lp = dataclasses.replace(lp, argv=("tail", "-n", "+1", "-f", str(output)))
            run_prefix = net.enter_argv(lp.hostname) if net else []
            if platform_run:
                run_prefix += ["env", f"--chdir={local_mpi.PLATFORM_CWD}"]
            else:
                run_prefix += sandboxes[lp.learner_id]
            ready = rendezvous / f"learner-{lp.learner_id}.ready"
            peers = [
                str(rendezvous / f"learner-{other.learner_id}.ready")
                for other in plan.learners
                if other.learner_id != lp.learner_id
            ]
            learner_spec = backend_learner_spec(
                request,
                lp,
                env,
                store=request.store,
                stop_grace_seconds=self.stop_grace_seconds,
                store_attempts=self.store_attempts,
                store_retry_seconds=self.store_retry_seconds,
            )
            learner_spec.write(ldir / "spec.json")
            host = LocalHost(
                private_dir=str(ldir),
                status_file=str(ldir / "status.json"),
                notify_socket=str(self.notify_path),
                run_prefix=run_prefix,
                ready_file=str(ready),
                wait_for=peers,
                # The platform's own processes are limited through their ranks.
                limits=Enforcement() if platform_run else enforcements[lp.learner_id],
                mpi_relay=mpi_relay if lp.role == Role.MPI_LAUNCHER else None,
            )
            host.write(ldir / "host.json")
            learners.append(
                {
                    "learner_id": lp.learner_id,
                    "role": lp.role.value,
                    "primary": lp.primary,
                    "spec": str(ldir / "spec.json"),
                    "spawned_at": None,
                }
            )
        return {
            "training_id": spec.training_id,
            "attempt": request.attempt,
            "namespaces": net is not None,
            "sandboxed": self.bwrap is not None,
            "primaries": list(plan.primaries),
            "notes": notes,
            "learners": learners,
        }

    def _sandbox_argv(
        self,
        learner_env: dict[str, str],
        extra: tuple[str, ...],
        runtime: RuntimeInfo | None,
        extra_readonly: tuple[str, ...] = (),
    ) -> list[str]:
        """The learner's sandbox prefix: its own directories writable, its runtime
        read-only, nothing else of DLAAS_HOME visible; empty where no sandbox can be made."""
        if self.bwrap is None:
            return []
        writable = [
            learner_env[name]
            for name in ("MODEL_DIR", "DATA_DIR", "RESULT_DIR", "LOG_DIR", "CHECKPOINT_DIR", "HOME")
        ]
        policy = sandbox.SandboxPolicy(
            writable=(*writable, *extra),
            readonly=(
                *sandbox.runtime_paths(runtime.python if runtime else sys.executable),
                *extra_readonly,
            ),
            hidden=self.hidden,
        )
        return sandbox.argv(policy, self.bwrap)

    @staticmethod
    def _learner_envs(
        plan: LaunchPlan, tdir: Path, results: Path, checkpoints: Path
    ) -> dict[int, dict[str, str]]:
        envs = {}
        for lp in plan.learners:
            ldir = tdir / f"learner-{lp.learner_id}"
            env = envs[lp.learner_id] = {
                "LEARNER_ID": str(lp.learner_id),
                "MODEL_DIR": str(ldir / "model"),
                "DATA_DIR": str(ldir / "data"),
                "RESULT_DIR": str(results),
                "LOG_DIR": str(ldir / "logs"),
                "CHECKPOINT_DIR": str(checkpoints),
                "HOME": str(ldir / "home"),
            }
            env.update(convention_directories(plan.conventions, env))
        return envs

    @staticmethod
    def _runtime_env(runtime: RuntimeInfo | None) -> dict[str, str]:
        """The learner runtime first on PATH (its python, python3, mpirun): the training's
        (service.runtimes), or this installation's Python (with the tensorflow and mpi
        extras). The trusted wrapper and the ranks' prefix run in the platform's Python."""
        bindir = runtime.bin_dir if runtime is not None else str(Path(sys.executable).parent)
        env = {
            "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONUNBUFFERED": "1",
        }
        if runtime is not None:
            # Its own libmpi, not the one a cached Horovod wheel was built against.
            env["LD_LIBRARY_PATH"] = runtime.lib_dir
        # No PYTHONPATH: the platform's own Python (the rank prefix, the MPI agent) names
        # its source explicitly and ignores the environment (service.sandbox.isolated).
        return env

    @staticmethod
    def _spawn(spec_path: Path) -> None:
        host_path = spec_path.with_name("host.json")
        log = spec_path.with_name("wrapper.log")
        # setsid -f: the wrapper leads its own session and is nobody's child here, so it
        # outlives this worker and leaves no zombie behind.
        # Its working directory is the learner's private one (0700, never in a sandbox).
        with open(log, "ab") as out:
            subprocess.run(
                ["setsid", "-f", *wrapper_argv(spec_path, host_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                check=True,
                cwd=str(spec_path.parent),
                # The platform's settings (S3 and encryption keys among them) stay out of
                # the wrapper's environment: it reads everything from its spec file.
                env={k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")},
            )

    # -- observe -------------------------------------------------------------------------

    def observe(self, training_id: str) -> Observation | None:
        tdir = self._dir(training_id)
        state = local_learners.read_json(tdir / "state.json")
        if state is None:
            return None
        if any(learner["spawned_at"] is None for learner in state["learners"]):
            # A start that did not finish (its worker died before spawning every learner):
            # not started, as far as the monitor knows. It sends the launch again, and
            # start() spawns the rest; reported as learners PENDING for ever, it would not.
            return None
        now = time.time()
        observed = []
        for learner in state["learners"]:
            observed.append(local_learners.observe_learner(training_id, learner, now))
        return Observation(
            learners=tuple(observed),
            primaries=tuple(state["primaries"]),
            notes=tuple(state["notes"]),
            attempt=int(state.get("attempt", 1)),
        )

    # -- stop and clean up -----------------------------------------------------------------

    def stop(self, training_id: str) -> None:
        tdir = self._dir(training_id)
        state = local_learners.read_json(tdir / "state.json")
        if state is not None:
            self._stop_learners(training_id, state)
        # Its network even where no learner was recorded: a start that failed after making
        # it (state.json is written once everything is prepared) leaves it to this.
        if (tdir / "net").is_dir():
            net = LearnerNetwork.attach(tdir / "net")
            if net is not None:
                net.destroy()  # whatever the user's commands started inside the namespaces

    def _stop_learners(self, training_id: str, state: dict[str, Any]) -> None:
        groups = local_learners.process_groups(training_id, state)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_seconds + 2.0
        while time.monotonic() < deadline and any(local_learners.group_alive(g) for g in groups):
            time.sleep(0.05)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def cleanup(self, training_id: str) -> None:
        self.stop(training_id)
        shutil.rmtree(self._dir(training_id), ignore_errors=True)

    def changed(self) -> set[str] | None:
        """None: a learner's status lives in its status file, which only observe() reads,
        so every pass of the monitor reconciles every active training (few, on one
        machine; each observe is a file read)."""
        return None

    def held(self) -> list[str]:
        if not self.work_root.is_dir():
            return []
        return sorted(entry.name for entry in self.work_root.iterdir() if entry.is_dir())

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoints(self, training_id: str, store: ObjectStore, prefix: str) -> int | None:
        """The learners share one CHECKPOINT_DIR; its regular files with one link are
        copied, read through service.tenantfs (no link followed, nothing else the user's
        code left there). Called with the learners stopped."""
        tdir = self._dir(training_id)
        if local_learners.read_json(tdir / "state.json") is None:
            return None
        saved = 0
        for key, ref in tree(tdir / "checkpoints", prefix):
            # Opened beneath CHECKPOINT_DIR's descriptor, read to the size fstat gave.
            opened = ref.open()
            if opened is None:
                continue
            with opened:
                saved += store.put_stream(key, opened.reader(), opened.size).size
        return saved

    @staticmethod
    def _restore_checkpoints(request: StartRequest, into: Path) -> None:
        """The last attempt's CHECKPOINT_DIR into this one's, before any learner runs."""
        prefix = request.restore_checkpoints
        assert prefix is not None
        store = open_store(request.store)
        into.mkdir(parents=True, exist_ok=True)
        with TenantDir.open(into) as directory:
            for info in store.list(prefix):
                relative = info.key[len(prefix) :]
                # Keys the platform wrote from relative paths; checked again all the same
                # (TenantDir.write refuses `..`, and any link on the way).
                try:
                    check_key(relative)
                except ValueError:
                    continue
                with store.open(info.key) as src:
                    directory.write(relative, src)
