"""The whole journey on the embedded platform, through the `dlaas` Python client.

1. start the platform: `dlaas up` on a temporary DLAAS_HOME (it creates the `local` tenant
   and writes the client config, so `Client()` below needs no URL and no key);
2. submit manifests/06-quickstart.yaml with the code in examples/quickstart/: a 2-learner
   distributed TensorFlow training on generated data that writes a SavedModel;
3. follow its logs until it ends;
4. deploy the trained model and score a few inputs with it; print the predictions;
5. stop the platform (Ctrl-C does the same for `dlaas up` in a terminal).

Run it with `make quickstart` (which installs everything first), or
`.venv/bin/python examples/quickstart.py [--keep] [--port N]`. Exits non-zero if any step
fails, after showing the platform's output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from dlaas import Client, DlaasError

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "manifests" / "06-quickstart.yaml"
CODE = ROOT / "examples" / "quickstart"
INPUTS = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-0.5, 0.25]]
STARTED = time.monotonic()


def step(message: str) -> None:
    print(f"\n==> [{time.monotonic() - STARTED:5.1f} s] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def dlaas_executable() -> str:
    beside = Path(sys.executable).with_name("dlaas")
    found = str(beside) if beside.exists() else shutil.which("dlaas")
    if not found:
        raise SystemExit("the dlaas command is not installed: run `make quickstart`")
    return found


def start_platform(home: Path, port: int, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env["DLAAS_HOME"] = str(home)
    server = subprocess.Popen(
        [dlaas_executable(), "up", "--port", str(port)], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"dlaas up exited with code {server.returncode}")
        if (home / "client.json").exists():
            with Client(url) as probe:
                if probe.healthy():
                    return server, url
        time.sleep(0.2)
    raise RuntimeError("the platform did not start within 120 s")


def journey() -> None:
    # `dlaas up` wrote $DLAAS_HOME/client.json: the client finds the API and the key there.
    with Client() as client:
        step(f"submitting {MANIFEST.relative_to(ROOT)} with the code in examples/quickstart/")

        def uploaded(done: int, total: int | None) -> None:
            if done == total:
                print(f"    uploaded the code ({done} bytes)", flush=True)

        training = client.trainings.create(MANIFEST, CODE, progress=uploaded)
        print(f"    training {training.id}: {training.status} ({training.name})")

        step("following the logs of both learners until the training ends")
        with client.trainings.logs(training.id, follow=True) as lines:
            for line in lines:
                print(f"    | {line}", flush=True)
        done = client.trainings.wait(training.id, timeout=120, poll_interval=0.2)
        print(f"    training {done.id}: {done.status}")
        for event in done.status_history:
            print(f"      {event.at:%H:%M:%S.%f}"[:-3] + f"  {event.status}")
        if not done.succeeded:
            raise RuntimeError(f"the training ended {done.status}: {done.status_message}")
        stored = [f.path for f in client.trainings.results(done.id)]
        model = sorted(p for p in stored if p.startswith("model/"))
        print(f"    stored results: {len(stored)} files, the SavedModel among them:")
        for path in model[:4]:
            print(f"      {path}")

        step("deploying the trained model for online scoring")
        deployment = client.deployments.create(done.id, name="quickstart")
        deployment = client.deployments.wait(deployment.id, timeout=180)
        print(f"    deployment {deployment.id}: {deployment.status}")
        if not deployment.ready:
            raise RuntimeError(f"the deployment FAILED: {deployment.status_message}")

        step(f"scoring {len(INPUTS)} inputs: POST /v1/deployments/{deployment.id}/predictions")
        predictions = client.deployments.predict(deployment.id, INPUTS)
        print("    x1      x2      prediction   (truth: 3*x1 - 2*x2 + 0.5)")
        for (x1, x2), prediction in zip(INPUTS, predictions, strict=True):
            value = prediction[0] if isinstance(prediction, list) else prediction
            print(f"    {x1:<7} {x2:<7} {value:<12.4f} ({3 * x1 - 2 * x2 + 0.5:.4f})")
        print(f"\npredictions: {predictions}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--keep", action="store_true", help="keep the temporary DLAAS_HOME")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dlaas-quickstart-"))
    os.environ["DLAAS_HOME"] = str(home)  # where this process's Client() finds the config
    for name in ("DLAAS_URL", "DLAAS_API_KEY", "DLAAS_CONFIG"):
        os.environ.pop(name, None)
    port = args.port or free_port()
    up_log = home / "dlaas-up.log"
    failed = False
    step(f"starting the platform: dlaas up --port {port}   (DLAAS_HOME={home})")
    with up_log.open("ab") as log:
        server: subprocess.Popen[bytes] | None = None
        try:
            server, url = start_platform(home, port, log)
            print(f"    the API is up on {url} (docs: {url}/docs); its output: {up_log}")
            journey()
        except (DlaasError, RuntimeError, OSError) as e:
            failed = True
            print(f"\nquick start FAILED: {e}", file=sys.stderr)
        finally:
            if server is not None and server.poll() is None:
                step("stopping the platform (SIGINT, as Ctrl-C would)")
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    if failed:
        print(f"\n--- the platform's output ({up_log}) ---", file=sys.stderr)
        print(up_log.read_text(errors="replace")[-6000:], file=sys.stderr)
        return 1
    if args.keep:
        print(f"kept the platform's state in {home}: DLAAS_HOME={home} dlaas up")
    else:
        shutil.rmtree(home, ignore_errors=True)
    step("done: started the platform, trained on 2 learners, deployed, scored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
