"""A real S3 endpoint for tests: moto's server (`moto[server]`) in a subprocess on a free
127.0.0.1 port. It accepts any credentials and keeps objects in memory."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
def moto_server() -> Iterator[S3Server]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
