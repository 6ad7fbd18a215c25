"""The local backend: this machine as a small cluster, one process tree per learner.

Every learner is a learner wrapper (`python -m worker.learner SPEC`) in its own session,
so it outlives the worker that started it: a worker killed mid-training is simply
restarted, and the monitor keeps observing the learners through their status files. The
wrapper (trusted: it fetches and stores with the credentials) runs outside; the user's
command runs inside the learner's network and UTS namespaces (worker.backends.netns), so
every learner is reachable as `$LEARNER_NAME_PREFIX-$LEARNER_ID` and can serve port 2222,
as in a pod, and there inside a sandbox (service.sandbox: bubblewrap) that shows it only
the system, the runtime and its own training's directories. MPI jobs: `mpirun` and its
daemons (the runtime's Open MPI) are the platform's, run in the learners' namespaces;
each rank enters its learner's sandbox (worker.learner.rank). Where namespaces are
unavailable the learners share the loopback on distinct ports (carried in TF_CONFIG);
where no sandbox can be made the commands run unsandboxed (only the local tenant's, unless
DLAAS_ALLOW_UNSANDBOXED); the training's status says so.

Layout under DLAAS_HOME/work/<training id>/: state.json (what was started),
net/ (the learner network), results/ (RESULT_DIR, shared by all learners), rendezvous/,
hostfile and ranks.json (MPI), mpi/ (the MPI session directory, TMPDIR of mpirun),
learner-<i>/ (private: spec.json, host.json, status.json, training-log.txt, wrapper.log;
and the sandbox's model/, data/, logs/, home/), checkpoints/ (CHECKPOINT_DIR, shared by
the learners: restored from the last attempt's before they start, saved by the worker
once they are stopped). Cleanup removes it all once the results are stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from service.domain.lifecycle import LearnerObservation
from service.runtimes import RuntimeInfo
from service.sandbox import limits
from service.sandbox.limits import Enforcement, ResourceLimits
from service.storage import open_store
from service.storage.base import ObjectStore
from worker.backends.base import Observation, StartRequest
from worker.backends.base import learner_spec as backend_learner_spec
from worker.backends.netns import SUBNET, LearnerNetwork, namespaces_available
from worker.launchers import plan_launch
from worker.launchers.plan import (
    Addressing,
    LaunchPlan,
    LearnerPlan,
    MpiSetup,
    Role,
    learner_name_prefix,
)
from worker.learner.host import LocalHost
from worker.learner.transfers import tree_files

log = logging.getLogger(__name__)

# A learner whose wrapper has not reported within this many seconds never started.
START_TIMEOUT = 60.0
_FALLBACK_NOTE = (
    "learner namespaces are unavailable here ({why}); learners share 127.0.0.1 on distinct "
    "ports (see TF_CONFIG) and their host names do not resolve"
)
_UNSANDBOXED_NOTE = "the learners' commands run without a sandbox here ({why})"
# The platform's own learners (mpirun and its daemons, MPI hosts' placeholder) run in
# the learner's namespaces but outside the sandbox; their ranks enter it.
_PLATFORM_ROLES = (Role.MPI_LAUNCHER, Role.MPI_HOST)
_GIB = 1024**3


def _rank_output(tdir: Path, learner_id: int) -> Path:
    """The file an MPI host's ranks write their output to; the host relays it to its log."""
    return tdir / f"learner-{learner_id}" / "rank-output"


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


_MAX_STATE_BYTES = 1024 * 1024  # a status or state file is a few hundred bytes


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_STATE_BYTES + 1)
        if len(raw) > _MAX_STATE_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _belongs(pid: object, training_id: str, spec_path: Path) -> bool:
    """Whether `pid` (from a status file: untrusted) is a live process of this learner:
    its wrapper (whose command line names the spec) or its command (whose environment
    names the training). Anything else, another training's process included, is not."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not 1 < pid < 2**22:
        return False
    if not _pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if str(spec_path).encode() in cmdline:
            return True
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"TRAINING_ID={training_id}".encode() in environ


def _phases(value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        return ()
    out = []
    for k, v in value.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out.append((str(k), float(v)))
    return tuple(out)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


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
        state = _read_json(state_file)
        if state is None:
            state = self._prepare(request, tdir)
            if request.restore_checkpoints is not None:
                self._restore_checkpoints(request, tdir / "checkpoints")
            _write_json(state_file, state)
        # Spawn what was not spawned yet: a launch delivered twice, or after a worker died
        # halfway, never starts a learner twice. A worker killed between spawning a learner
        # and recording it left that learner running (or ended): it is recorded, not
        # started again.
        for learner in state["learners"]:
            if learner["spawned_at"] is None:
                spec_path = Path(learner["spec"])
                if not self._wrapper_started(spec_path):
                    self._spawn(spec_path)
                learner["spawned_at"] = time.time()
                _write_json(state_file, state)

    def _prepare(self, request: StartRequest, tdir: Path) -> dict[str, Any]:
        spec = request.spec
        prefix = learner_name_prefix(spec.training_id)
        notes: list[str] = []
        net: LearnerNetwork | None = None
        if self.use_namespaces:
            addressing = Addressing.per_learner_hosts(prefix, spec.nodes)
            net = LearnerNetwork.attach(tdir / "net") or LearnerNetwork.create(
                spec.training_id, list(addressing.hostnames), tdir / "net"
            )
        else:
            addressing = Addressing.shared_loopback(prefix, spec.nodes, _free_ports(spec.nodes))
            notes.append(_FALLBACK_NOTE.format(why=self.namespaces_missing))

        mpi = None
        if spec.distribution == "mpi":
            mpi = self._mpi_setup(tdir, net, request.runtime)
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
            extra = (str(mpi_session),) if mpi is not None else ()
            sandboxes[lp.learner_id] = self._sandbox_argv(
                learners_env[lp.learner_id], extra, request.runtime
            )
        if plan.hostfile is not None:
            hostfile = plan.hostfile if net else f"localhost slots={spec.nodes}\n"
            (tdir / "hostfile").write_text(hostfile)
            per_learner = {
                lp.learner_id: self._rank(lp, tdir, learners_env, sandboxes, enforcements)
                for lp in plan.learners
            }
            ranks: dict[str, Any] = {
                "hosts": {lp.hostname: per_learner[lp.learner_id] for lp in plan.learners},
                "by_rank": {
                    str(lp.learner_id - 1): per_learner[lp.learner_id] for lp in plan.learners
                },
            }
            _write_json(tdir / "ranks.json", ranks)

        learners = []
        for lp in plan.learners:
            ldir = tdir / f"learner-{lp.learner_id}"
            ldir.mkdir(parents=True, exist_ok=True)
            ldir.chmod(0o700)
            env = {**self._runtime_env(request.runtime), **lp.env, **learners_env[lp.learner_id]}
            if mpi is not None and lp.role == Role.MPI_LAUNCHER:
                env["TMPDIR"] = str(mpi_session)  # the MPI session directory ranks share
            Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
            platform_run = lp.role in _PLATFORM_ROLES
            if lp.role == Role.MPI_HOST:
                # The host's output is what its ranks write (worker.learner.rank): relayed
                # from the start of the file for as long as the learner runs.
                output = _rank_output(tdir, lp.learner_id)
                os.close(os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
                lp = dataclasses.replace(lp, argv=("tail", "-n", "+1", "-f", str(output)))
            run_prefix = net.enter_argv(lp.hostname) if net else []
            if not platform_run:
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
        self, learner_env: dict[str, str], extra: tuple[str, ...], runtime: RuntimeInfo | None
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
            readonly=sandbox.runtime_paths(runtime.python if runtime else sys.executable),
            hidden=self.hidden,
        )
        return sandbox.argv(policy, self.bwrap)

    @staticmethod
    def _rank(
        lp: LearnerPlan,
        tdir: Path,
        envs: dict[int, dict[str, str]],
        sandboxes: dict[int, list[str]],
        enforcements: dict[int, Enforcement],
    ) -> dict[str, Any]:
        """What a rank on learner `lp` needs (worker.learner.rank): its variables, its
        sandbox, its limits and, on an MPI host, where its output goes. mpirun would
        forward every rank's output to the launcher: the launcher's log would show each
        line of every rank (each TensorFlow start-up notice once per rank) as its own."""
        rank: dict[str, Any] = {
            "env": envs[lp.learner_id],
            "prefix": sandboxes[lp.learner_id],
            "limits": enforcements[lp.learner_id].to_dict(),
        }
        if lp.role == Role.MPI_HOST:
            rank["output"] = str(_rank_output(tdir, lp.learner_id))
        return rank

    def _mpi_setup(
        self, tdir: Path, net: LearnerNetwork | None, runtime: RuntimeInfo | None
    ) -> MpiSetup:
        # The runtime's MPI (its mpirun starts its own prted), the one its ranks' libraries
        # were built against; the platform's where the runtime is the platform's.
        if runtime is not None:
            mpirun = shutil.which("mpirun", path=runtime.bin_dir)
            if mpirun is None:
                raise RuntimeError(f"the runtime '{runtime.name}' has no mpirun")
        else:
            mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which(
                "mpirun"
            )
        if mpirun is None:
            raise RuntimeError("mpirun is not installed (pip install 'dlaas[mpi]')")
        options: list[str] = ["--mca", "btl", "tcp,self"]
        # Ranks run as the sandbox's unprivileged uid (service.sandbox.SANDBOX_UID), not
        # mpirun's: PMIx's native check compares the uid a client states with the server's
        # and would refuse them. It was no boundary (a client may state any uid over TCP);
        # the learner's network namespace is what keeps others from the PMIx server.
        options += ["--pmixmca", "psec", "none"]
        if net is not None:
            # Root inside the learners' user namespace; daemons start through the agent
            # that enters the target learner (the local analogue of kubectl exec).
            options += ["--allow-run-as-root", "--prtemca", "plm_ssh_agent", str(net.agent)]
            options += ["--mca", "btl_tcp_if_include", SUBNET]
            options += ["--prtemca", "oob_tcp_if_include", SUBNET]
        elif os.geteuid() == 0:
            options.append("--allow-run-as-root")
        rank_prefix = (sys.executable, "-m", "worker.learner.rank", str(tdir / "ranks.json"), "--")
        return MpiSetup(
            mpirun=mpirun,
            hostfile_path=str(tdir / "hostfile"),
            options=tuple(options),
            rank_prefix=rank_prefix,
        )

    @staticmethod
    def _learner_envs(
        plan: LaunchPlan, tdir: Path, results: Path, checkpoints: Path
    ) -> dict[int, dict[str, str]]:
        envs = {}
        for lp in plan.learners:
            ldir = tdir / f"learner-{lp.learner_id}"
            envs[lp.learner_id] = {
                "LEARNER_ID": str(lp.learner_id),
                "MODEL_DIR": str(ldir / "model"),
                "DATA_DIR": str(ldir / "data"),
                "RESULT_DIR": str(results),
                "LOG_DIR": str(ldir / "logs"),
                "CHECKPOINT_DIR": str(checkpoints),
                "HOME": str(ldir / "home"),
            }
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
        # The rank prefix and the MPI agent import the platform's modules; the sandbox
        # unsets it, so the user's command does not.
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        return env

    @staticmethod
    def _wrapper_started(spec_path: Path) -> bool:
        """Whether the learner's wrapper was started: it reported a status, or a live
        process names its spec (the wrapper, or `setsid` about to become it)."""
        if spec_path.with_name("status.json").exists():
            return True
        needle = str(spec_path).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in cmdline and _pid_alive(int(entry)):
                return True
        return False

    @staticmethod
    def _spawn(spec_path: Path) -> None:
        host_path = spec_path.with_name("host.json")
        log = spec_path.with_name("wrapper.log")
        # setsid -f: the wrapper leads its own session and is nobody's child here, so it
        # outlives this worker and leaves no zombie behind.
        with open(log, "ab") as out:
            subprocess.run(
                [
                    "setsid",
                    "-f",
                    sys.executable,
                    "-m",
                    "worker.learner",
                    str(spec_path),
                    str(host_path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                check=True,
                cwd=str(spec_path.parent),
                env={
                    # The platform's settings (S3 and encryption keys among them) stay out of
                    # the wrapper's environment: it reads everything from its spec file.
                    **{k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")},
                    "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                },
            )

    # -- observe -------------------------------------------------------------------------

    def observe(self, training_id: str) -> Observation | None:
        tdir = self._dir(training_id)
        state = _read_json(tdir / "state.json")
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
            observed.append(self._observe_learner(training_id, learner, now))
        return Observation(
            learners=tuple(observed),
            primaries=tuple(state["primaries"]),
            notes=tuple(state["notes"]),
            attempt=int(state.get("attempt", 1)),
        )

    @staticmethod
    def _observe_learner(
        training_id: str, learner: dict[str, Any], now: float
    ) -> LearnerObservation:
        lid = int(learner["learner_id"])
        spec_path = Path(learner["spec"])
        status = _read_json(spec_path.with_name("status.json"))
        if status is None:
            spawned = learner["spawned_at"]
            if spawned is not None and now - spawned > START_TIMEOUT:
                return LearnerObservation(lid, "LOST", None, f"learner {lid} did not start")
            return LearnerObservation(lid, "PENDING")
        phase = str(status.get("phase"))
        exit_code = status.get("exit_code")
        message = status.get("message")
        phases = _phases(status.get("phases"))
        if phase in ("COMPLETED", "FAILED", "HALTED"):
            return LearnerObservation(lid, phase, exit_code, message, phases)
        if not _belongs(status.get("pid"), training_id, spec_path):
            return LearnerObservation(lid, "LOST", None, f"learner {lid} stopped reporting (lost)")
        return LearnerObservation(lid, phase, exit_code, message, phases)

    # -- stop and clean up -----------------------------------------------------------------

    def stop(self, training_id: str) -> None:
        tdir = self._dir(training_id)
        state = _read_json(tdir / "state.json")
        if state is None:
            return
        groups = self._process_groups(training_id, state)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_seconds + 2.0
        while time.monotonic() < deadline and any(self._group_alive(g) for g in groups):
            time.sleep(0.05)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        net = LearnerNetwork.attach(tdir / "net")
        if net is not None:
            net.destroy()  # whatever the user's commands started inside the namespaces

    @staticmethod
    def _process_groups(training_id: str, state: dict[str, Any]) -> list[int]:
        """The process groups of the training's wrappers and commands: only processes that
        belong to it, whatever a status file says."""
        groups: list[int] = []
        for learner in state["learners"]:
            spec_path = Path(learner["spec"])
            status = _read_json(spec_path.with_name("status.json")) or {}
            for key in ("pid", "child_pid"):
                pid = status.get(key)
                if _belongs(pid, training_id, spec_path):
                    assert isinstance(pid, int)
                    groups.append(pid)
        return groups

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return _pid_alive(pgid)

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
        """The learners share one CHECKPOINT_DIR; its regular files are copied (links
        only to files inside it, nothing else the user's code left there). Called with
        the learners stopped."""
        tdir = self._dir(training_id)
        if _read_json(tdir / "state.json") is None:
            return None
        saved = 0
        for key, path in tree_files(tdir / "checkpoints", prefix):
            saved += store.put_file(key, path).size
        return saved

    @staticmethod
    def _restore_checkpoints(request: StartRequest, into: Path) -> None:
        """The last attempt's CHECKPOINT_DIR into this one's, before any learner runs."""
        prefix = request.restore_checkpoints
        assert prefix is not None
        store = open_store(request.store)
        for info in store.list(prefix):
            relative = info.key[len(prefix) :]
            target = into / relative
            # Keys the platform wrote from relative paths; checked again all the same.
            if not relative or not target.resolve().is_relative_to(into.resolve()):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with store.open(info.key) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
