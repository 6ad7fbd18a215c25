"""The native front of the scoring gRPC port (service/scoring/grpc_front.py and
native/grpc_front/front.cc), with stand-in methods and caller check: each answer reaches
its own caller, a call the client abandons is cancelled here, an unknown method is refused
before the caller is checked, `stop` lets the calls under way end, a front that exits is
started again on its port, and the front never outlives the process that started it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc import aio

from service import sandbox
from service.errors import Unauthorized
from service.http.limits import CallerCheck
from service.scoring import grpc_front
from service.scoring.grpc_api import Method
from service.scoring.grpc_server import front_to_use
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ECHO = "/test.Echo/Echo"
SLOW = "/test.Echo/Slow"


class Callers:
    """Stand-in for CallerCheck: `Bearer good` passes, anything else is Unauthorized."""

    def __init__(self) -> None:
        self.checked: list[tuple[str, str]] = []

    async def check(self, key: Callable[[], str], host: str) -> None:
        self.checked.append((key(), host))
        if self.checked[-1][0] != "good":
            raise Unauthorized("bad key")


class Methods:
    def __init__(self, methods: dict[str, Method]) -> None:
        self.methods = methods

    def unary_methods(self) -> dict[str, Method]:
        return self.methods


def binary() -> Path:
    path = grpc_front.front_binary()
    assert path is not None, "dlaas-grpc-front is not built: run `make install`"
    return path


async def started(
    methods: dict[str, Method], callers: Callers, port: int = 0
) -> tuple[grpc_front.FrontServer, int]:
    settings = Settings(scoring_grpc_port=port)
    return await grpc_front.start_front(
        binary(), Methods(methods), settings, cast(CallerCheck, callers)
    )


@contextlib.asynccontextmanager
async def front(
    methods: dict[str, Method], callers: Callers | None = None
) -> AsyncIterator[tuple[grpc_front.FrontServer, aio.Channel]]:
    """A started front and a channel to it; the front stopped after."""
    server, port = await started(methods, callers or Callers())
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield server, channel
    finally:
        await server.stop(1)


def handler(
    fn: Callable[[bytes, Any], Awaitable[bytes]],
) -> Method:
    return Method(fn, lambda answer: answer)


async def echo(body: bytes, context: Any) -> bytes:
    await asyncio.sleep((body[0] % 7) / 1000 if body else 0)
    return body[::-1]


GOOD = (("authorization", "Bearer good"),)
BAD = (("authorization", "Bearer no"),)


def test_each_answer_reaches_its_own_caller() -> None:
    async def main() -> None:
        callers = Callers()
        async with front({ECHO: handler(echo)}, callers) as (_, channel):
            call = channel.unary_unary(ECHO)
            bodies = [os.urandom(1 + i * 37) for i in range(200)]
            answers = await asyncio.gather(*(call(b, metadata=GOOD, timeout=30) for b in bodies))
        assert answers == [b[::-1] for b in bodies]
        assert len(callers.checked) == 200
        assert {host for _, host in callers.checked} == {"127.0.0.1"}

    asyncio.run(main())


def test_refusals_and_unknown_methods() -> None:
    async def main() -> None:
        callers = Callers()
        async with front({ECHO: handler(echo)}, callers) as (_, channel):
            with pytest.raises(aio.AioRpcError) as refused:
                await channel.unary_unary(ECHO)(b"x", metadata=BAD)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert refused.value.details() == "bad key"
            checked = len(callers.checked)
            with pytest.raises(aio.AioRpcError) as unknown:
                await channel.unary_unary("/test.Echo/Nope")(b"x", metadata=GOOD)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert len(callers.checked) == checked  # refused before any check

    asyncio.run(main())


def test_a_call_its_client_abandons_is_cancelled_here() -> None:
    async def main() -> None:
        cancelled = asyncio.Event()

        async def forever(body: bytes, context: Any) -> bytes:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return b""

        async with front({SLOW: handler(forever)}) as (server, channel):
            with pytest.raises(aio.AioRpcError) as late:
                await channel.unary_unary(SLOW)(b"x", metadata=GOOD, timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(cancelled.wait(), 5)
            assert server.protocol is not None and server.protocol.calls == {}

    asyncio.run(main())


def test_a_handler_cancelled_from_within_still_ends_its_call() -> None:
    async def cancelled(body: bytes, context: Any) -> bytes:
        never: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        never.cancel()
        return await never

    async def main() -> None:
        async with front({SLOW: handler(cancelled)}) as (_, channel):
            with pytest.raises(aio.AioRpcError) as ended:
                await channel.unary_unary(SLOW)(b"x", metadata=GOOD, timeout=10)
            assert ended.value.code() == grpc.StatusCode.CANCELLED

    asyncio.run(main())


def test_stop_lets_the_calls_under_way_end() -> None:
    async def main() -> None:
        async def slow(body: bytes, context: Any) -> bytes:
            await asyncio.sleep(0.5)
            return body

        server, port = await started({SLOW: handler(slow)}, Callers())
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            under_way = asyncio.ensure_future(
                channel.unary_unary(SLOW)(b"last", metadata=GOOD, timeout=10)
            )
            await asyncio.sleep(0.2)
            began = time.monotonic()
            await server.stop(3)
            assert await under_way == b"last"
            assert time.monotonic() - began < 3
        assert server.process is not None and server.process.returncode == 0
        assert not _listening(port)

    asyncio.run(main())


def test_a_front_that_exits_is_started_again_on_its_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpc_front, "RESTART_SECONDS", 0.1)

    async def main() -> None:
        server, port = await started({ECHO: handler(echo)}, Callers())
        try:
            assert server.process is not None
            first = server.process.pid
            server.process.kill()
            deadline = time.monotonic() + 10
            while server.process.pid == first or server.protocol is None:
                assert time.monotonic() < deadline, "the front was not started again"
                await asyncio.sleep(0.05)
            assert server.port == port
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert await channel.unary_unary(ECHO)(b"ab", metadata=GOOD, timeout=10) == b"ba"
        finally:
            await server.stop(1)

    asyncio.run(main())


def test_a_port_in_use_is_a_clear_error() -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(RuntimeError, match="DLAAS_SCORING_GRPC_PORT"):
                await started({}, Callers(), port=taken.getsockname()[1])

    asyncio.run(main())


def test_the_front_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A platform process killed outright (SIGKILL: no shutdown ran) takes its front with
    it: the front's port is not left open with no one to answer."""
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, sys
            sys.path.insert(0, {str(ROOT)!r})
            from tests.api.test_grpc_front import Callers, echo, handler, started, ECHO

            async def main():
                server, port = await started({{ECHO: handler(echo)}}, Callers())
                print(server.process.pid, port, flush=True)
                await asyncio.sleep(3600)

            asyncio.run(main())
            """
        )
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        pid, port = map(int, parent.stdout.readline().split())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _state(pid) not in ("Z", "gone") or _listening(port):
            assert time.monotonic() < deadline, "the front outlived its process"
            time.sleep(0.05)
    finally:
        parent.kill()


@pytest.mark.skipif(not sandbox.probe().available, reason=sandbox.probe().why)
def test_the_front_runs_in_the_sandbox() -> None:
    """The front parses callers' bytes: it runs without privileges or capabilities, under
    the seccomp filter, in namespaces of its own, seeing its program and the system's
    libraries and none of the platform's files; and it still serves."""

    async def main() -> None:
        async with front({ECHO: handler(echo)}) as (server, channel):
            assert server.sandboxed and server.process is not None
            (pid,) = [p for p in _descendants(server.process.pid) if _exe(p) == binary()]
            status = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
            assert status["NoNewPrivs"].strip() == "1"
            assert status["Seccomp"].strip() == "2"  # a filter
            # The sandbox's, and the front's own once it listens (no new sockets).
            assert server.filtered and status["Seccomp_filters"].strip() == "2"
            assert status["CapEff"].strip() == "0000000000000000"
            for ns in ("user", "pid", "ipc"):
                assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
            inside = Path(f"/proc/{pid}/root")
            assert (inside / str(binary()).lstrip("/")).is_file()
            assert not (inside / str(ROOT / "service").lstrip("/")).exists()
            assert not (inside / str(Path(sys.executable).parent / "python").lstrip("/")).exists()
            assert await channel.unary_unary(ECHO)(b"ab", metadata=GOOD, timeout=10) == b"ba"

    asyncio.run(main())


def test_without_a_sandbox_the_front_still_opens_no_new_sockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no sandbox can be made the front runs as it is, but it still loads its own
    filter once it listens (no_new_privs, then the filter) and serves."""
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.SandboxSupport(None, "none here"))

    async def main() -> None:
        async with front({ECHO: handler(echo)}) as (server, channel):
            assert not server.sandboxed and server.filtered and server.process is not None
            status = Path(f"/proc/{server.process.pid}/status").read_text()
            assert "\nNoNewPrivs:\t1\n" in status and "\nSeccomp_filters:\t1\n" in status
            assert await channel.unary_unary(ECHO)(b"ab", metadata=GOOD, timeout=10) == b"ba"

    asyncio.run(main())


def test_a_filter_the_front_cannot_load_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The front reads and loads the filter it is given: one that is not a BPF program
    stops it before it answers any call, and says why."""
    broken = tmp_path / "listener.bpf"
    broken.write_bytes(b"not a program")
    monkeypatch.setattr(sandbox, "listener_filter", lambda: str(broken))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="seccomp filter is not a BPF program"):
            await started({ECHO: handler(echo)}, Callers())

    asyncio.run(main())


def test_a_filter_that_cannot_be_read_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A front is not started without the filter that was made for it."""
    monkeypatch.setattr(sandbox, "listener_filter", lambda: str(tmp_path / "gone.bpf"))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="network filter cannot be read"):
            await started({ECHO: handler(echo)}, Callers())

    asyncio.run(main())


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = [int(c) for c in (task / "children").read_text().split()]
            found += children
            todo += children
    return found


def _exe(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize(
    ("setting", "installed", "chosen"),
    [
        ("auto", Path("/x/dlaas-grpc-front"), Path("/x/dlaas-grpc-front")),
        ("auto", None, None),
        ("native", Path("/x/dlaas-grpc-front"), Path("/x/dlaas-grpc-front")),
        ("python", Path("/x/dlaas-grpc-front"), None),
        ("python", None, None),
    ],
)
def test_which_front(setting: str, installed: Path | None, chosen: Path | None) -> None:
    assert front_to_use(setting, installed) == chosen


def test_native_without_the_program_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="make install"):
        front_to_use("native", None)


def test_stop_while_the_front_is_started_again_leaves_no_front(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A front that exited and is being started again (its new process spawned, not yet
    ready) when `stop` comes is ended, and waited for, by the time `stop` returns."""
    monkeypatch.setattr(grpc_front, "RESTART_SECONDS", 0.05)
    spawned: list[subprocess.Popen[bytes]] = []

    class SlowToReap(subprocess.Popen):  # type: ignore[type-arg]
        """A front whose end takes a while to be waited for, as on a busy machine."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            spawned.append(self)

        def wait(self, timeout: float | None = None) -> int:
            time.sleep(0.3)
            return super().wait(timeout)

    async def main() -> None:
        server, _ = await started({ECHO: handler(echo)}, Callers())
        monkeypatch.setattr(grpc_front.subprocess, "Popen", SlowToReap)
        assert server.process is not None
        first = server.process
        first.kill()
        deadline = time.monotonic() + 10
        while not spawned:  # the second front is spawned and has not answered READY
            assert time.monotonic() < deadline, "the front was not started again"
            await asyncio.sleep(0.001)
        await server.stop(1)
        assert first.returncode is not None
        assert [p.returncode is not None for p in spawned] == [True] * len(spawned)

    asyncio.run(main())
