"""A real S3 endpoint for tests: moto's server (`moto[server]`) in a subprocess on a free
127.0.0.1 port. It accepts any credentials and keeps objects in memory. And a stub HTTP
server that answers every request alike (a redirect, say) and records what it got."""

from __future__ import annotations

import http.server
import io
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
from minio import Minio

ACCESS_KEY = "AKIA-PLATFORM-TEST"
SECRET_KEY = "platform-secret-Zq9w"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class S3Server:
    url: str

    @property
    def netloc(self) -> str:
        return self.url.removeprefix("http://")

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Minio:
        return Minio(
            self.netloc,
            access_key=access_key,
            secret_key=secret_key,
            secure=False,
            region="us-east-1",
        )

    def make_bucket(self, name: str, objects: dict[str, bytes] | None = None) -> None:
        client = self.client()
        client.make_bucket(name)
        for key, data in (objects or {}).items():
            client.put_object(name, key, io.BytesIO(data), len(data))

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        client = self.client()
        out = {}
        for obj in client.list_objects(bucket, prefix=prefix or None, recursive=True):
            response = client.get_object(bucket, obj.object_name)
            try:
                out[obj.object_name] = response.read()
            finally:
                response.close()
                response.release_conn()
        return out


@contextmanager
def moto_server(port: int | None = None, env: dict[str, str] | None = None) -> Iterator[S3Server]:
    """moto's server on `port` (default: a free one); a test may stop it and start another
    on the same port (an S3 endpoint that restarts: its objects and buckets are lost).
    `env`: more environment for it (moto's INITIAL_NO_AUTH_ACTION_COUNT, say)."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on port {port}") from None
                time.sleep(0.05)
        yield S3Server(url)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class StubServer:
    url: str
    # (method, path, Host header) of every request, in order
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    # the TLS server names clients asked for (SNI)
    server_names: list[str | None] = field(default_factory=list)


@contextmanager
def stub_server(
    status: int = 200,
    location: str | None = None,
    host: str = "127.0.0.1",
    tls: tuple[str, str] | None = None,
) -> Iterator[StubServer]:
    """An HTTP server on a free port of `host` answering every request with `status` (and
    `location` as its Location header), an empty body. `tls`: (certificate file, key
    file) to serve HTTPS."""
    stub = StubServer("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            stub.requests.append((self.command, self.path, self.headers.get("Host", "")))
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, 0), Handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)

        def sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
            stub.server_names.append(name)

        context.sni_callback = sni  # type: ignore[assignment]
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    netloc = f"[{host}]" if ":" in host else host
    stub.url = f"{scheme}://{netloc}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
