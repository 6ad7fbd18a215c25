"""The ssh agent a sandboxed `mpirun` calls: `python -I mpi_client.py SOCKET_DIR [ssh
options] HOST COMMAND...` (see worker.learner.mpi_relay).

It runs inside learner 1's sandbox, so it is the standard library alone (run as a file
with the runtime's `python -I`, bound read-only): it passes its standard input, output
and error with the host and the command (the words joined with spaces, as ssh does) to
the training's relay, and exits with the code the relay answers.
"""

from __future__ import annotations

import json
import os
import socket
import sys

_WITH_VALUE = frozenset("bcDEeFIiJLlmOopQRSWw")
_SOCKET_NAME = "relay.sock"
_REFUSED = 255


def request(args: list[str]) -> tuple[str, str, bytes]:
    """(socket directory, host, the request's bytes) of the agent's arguments."""
    if len(args) < 3:
        raise ValueError("usage: mpi_client.py SOCKET_DIR [ssh options] HOST COMMAND...")
    directory, rest = args[0], list(args[1:])
    while rest and rest[0].startswith("-"):
        opt = rest.pop(0)
        if opt == "--":
            break
        if len(opt) == 2 and opt[1] in _WITH_VALUE and rest:
            rest.pop(0)
    if len(rest) < 2:
        raise ValueError("mpi_client.py: missing host or command")
    host, command = rest[0], " ".join(rest[1:])
    return directory, host, json.dumps({"host": host, "command": command}).encode()


def main(argv: list[str]) -> int:
    try:
        directory, host, message = request(argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        return _REFUSED
    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(f"/proc/self/fd/{dirfd}/{_SOCKET_NAME}")
            socket.send_fds(conn, [message], [0, 1, 2])
            reply = conn.recv(4096)
    except OSError as e:
        print(f"mpi_client.py: the relay for {host!r} cannot be reached: {e}", file=sys.stderr)
        return _REFUSED
    finally:
        os.close(dirfd)
    try:
        code = json.loads(reply)["exit"]
    except (ValueError, KeyError, TypeError):
        return _REFUSED
    return code if isinstance(code, int) and 0 <= code < 256 else _REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
