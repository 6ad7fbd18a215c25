"""Online scoring: predictions through the REST endpoint against calling the same loaded
model in this process, and dynamic batching on against off.

    python benchmarks/scoring.py [--quick] [--only scoring_rest_tfs_path_b64]

Runs the platform on a temporary DLAAS_HOME (the API under uvicorn with scoring in its
process and each model in its sandboxed model process, a Celery worker, the monitor),
trains the models through it (real TensorFlow learners), deploys them, and stops the
worker and the monitor. A second API process on the
same home runs with DLAAS_SCORING_BATCHING=false. The load generator is
benchmarks/loadgen.py (keep-alive connections over asyncio streams) at a fixed concurrency.
Prints one JSON row per measurement: `{name, value, unit, baseline, ratio, detail}`,
ratio = value / baseline, each value the median over the repeats. What is compared is
measured in turn within each repeat (in-process, then the endpoint; batching on, then
off), so a noisy neighbour hits both alike.

An API of its own (batching on, as the REST one) serves TensorFlow Serving's gRPC API
(DLAAS_SCORING_GRPC_PORT), so the REST rows measure the API as it runs without it: the
`scoring_grpc_<model>_b64` rows are batch-64 predictions through it (a PredictRequest made
with tensorflow-serving-api and tf.make_tensor_proto, 4 calls in flight on one HTTP/2
connection, sent by nghttp2's h2load: grpcio's client cost as much CPU per call as the
server on the same two cores; every answer is checked to be the answer's message, whose
numbers a grpcio call checked first against REST's) against the same in-process
baseline, measured in turn with it.

`scoring_rest_tfs_path_b64` is TensorFlow Serving's REST path, `POST
/v1/models/{name}:predict` with a batch of 64 `instances`, on the batching API, against
the same in-process baseline (`mlp`; `--only scoring_rest_tfs_path_b64` trains and
deploys that model alone and measures only this row).

Models, from no compute to much: `keras-single` (examples/keras-single, 2-16-1), `mlp`
(32 inputs, 4 x 1024 relu, 10 outputs) and `wide` (32 inputs, 2 x 4096 relu, 10 outputs).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    ROOT,
    Row,
    create_tenant,
    free_port,
    manifest,
    median,
    percentile,
    profiled,
    stop_process,
    wait_answering,
    zip_code,
)
from benchmarks.loadgen import hammer, hammer_grpc
from service.http.server import UVICORN_FLAGS

ADMIN = "bench-admin"
BATCHING_CONCURRENCY = 8
THROUGHPUT_CONCURRENCY = 4
GRPC_PREDICT = "/tensorflow.serving.PredictionService/Predict"

MLP_CODE = """\
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

inputs, width, depth = (int(a) for a in sys.argv[1:4])
tf.keras.utils.set_random_seed(0)
layers = [tf.keras.Input(shape=(inputs,), name="x")]
layers += [tf.keras.layers.Dense(width, activation="relu") for _ in range(depth)]
model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(10)])


class Exported(tf.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, inputs], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.model(x, training=False)}


module = Exported(model)
out = os.path.join(os.environ["RESULT_DIR"], "model")
tf.saved_model.save(module, out, signatures={"serving_default": module.serve})
print("saved", out, flush=True)
"""


@dataclass(frozen=True)
class Model:
    name: str
    features: int
    command: str
    code: bytes


def _keras_single() -> bytes:
    return zip_code({"train.py": (ROOT / "examples" / "keras-single" / "train.py").read_text()})


MODELS = (
    Model("keras-single", 2, "python3 train.py --epochs 1 --samples 256", _keras_single()),
    Model("mlp", 32, "python3 train.py 32 1024 4", zip_code({"train.py": MLP_CODE})),
    Model("wide", 32, "python3 train.py 32 4096 2", zip_code({"train.py": MLP_CODE})),
)


@dataclass
class Sample:
    """One timed run: throughput and per-call latencies (seconds)."""

    per_second: float
    latencies: list[float]


def summarize(samples: list[Sample]) -> tuple[float, float, float]:
    """Median over repeats of: throughput, p50 (ms), p99 (ms)."""
    return (
        median([s.per_second for s in samples]),
        median([percentile(s.latencies, 50) for s in samples]) * 1000,
        median([percentile(s.latencies, 99) for s in samples]) * 1000,
    )


class Bench:
    """The platform's processes on one DLAAS_HOME: API processes (scoring in-process) by
    name, and while models are trained, a worker and the monitor."""

    def __init__(self, home: Path, catalog: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
        self.env.update(
            DLAAS_HOME=str(home), DLAAS_ADMIN_API_KEY=ADMIN, DLAAS_CATALOG_FILE=str(catalog)
        )
        self.urls: dict[str, str] = {}
        self.grpc_targets: dict[str, str] = {}
        self.headers: dict[str, str] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, args: list[str], **settings: str) -> subprocess.Popen[bytes]:
        self.home.mkdir(parents=True, exist_ok=True)
        with (self.home / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *args],
                env={**self.env, **settings},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = proc
        return proc

    def start_api(self, name: str, *, grpc: bool = False, **settings: str) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if grpc:
            grpc_port = free_port()
            settings["DLAAS_SCORING_GRPC_PORT"] = str(grpc_port)
            self.grpc_targets[name] = f"127.0.0.1:{grpc_port}"
        proc = self.spawn(
            name,
            [
                "-m", "uvicorn", "--factory", "service.api.app:create_app",
                "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", "--no-access-log", *UVICORN_FLAGS,
            ],
            **settings,
        )  # fmt: skip
        wait_answering(f"{url}/healthz", proc, self.home / f"{name}.log")
        self.urls[name] = url
        return url

    def create_tenant(self, url: str) -> None:
        self.headers = create_tenant(url, ADMIN)

    def client(self, url: str) -> httpx.Client:
        return httpx.Client(base_url=url, headers=self.headers, timeout=60)

    def stop(self, name: str) -> None:
        stop_process(self.processes.pop(name))

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)


def catalog_file(tmp: Path) -> Path:
    """The standard plan with a prediction limit the benchmark cannot reach."""
    path = tmp / "catalog.yaml"
    plan = {"distributed": True, "max_nodes": 16, "max_concurrent_trainings": 8}
    plans = {
        "standard": {**plan, "predictions_per_minute": 10**9},
        "lite": {**plan, "distributed": False, "max_nodes": 1, "predictions_per_minute": 500},
    }
    path.write_text(yaml.safe_dump({"plans": plans}))
    return path


def train_and_deploy(bench: Bench, url: str, model: Model) -> tuple[str, Path]:
    """Train `model` through the platform and deploy it; the deployment id and where the
    SavedModel lies in the platform's object store."""
    with bench.client(url) as http:
        r = http.post(
            "/v1/trainings",
            files={
                "manifest": ("manifest.yaml", manifest(model.command)),
                "model_definition": ("code.zip", model.code),
            },
        )
        r.raise_for_status()
        training_id = r.json()["id"]
        deadline = time.monotonic() + 300
        while (t := http.get(f"/v1/trainings/{training_id}").json())["status"] not in (
            "COMPLETED", "FAILED", "HALTED",
        ):  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"training {model.name} is still {t['status']}")
            time.sleep(0.1)
        if t["status"] != "COMPLETED":
            logs = http.get(f"/v1/trainings/{training_id}/logs").text[-2000:]
            raise RuntimeError(f"training {model.name} {t['status']}:\n{logs}")
        r = http.post("/v1/deployments", json={"training_id": training_id, "name": model.name})
        r.raise_for_status()
        deployment_id = r.json()["id"]
        wait_ready(http, deployment_id)
    model_dir = bench.home / "objects" / "trainings" / training_id / "results" / "model"
    return deployment_id, model_dir


def wait_ready(http: httpx.Client, deployment_id: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        d = http.get(f"/v1/deployments/{deployment_id}").json()
        if d["status"] == "READY":
            return
        if d["status"] == "FAILED":
            raise RuntimeError(f"deploying {deployment_id} failed: {d['status_message']}")
        time.sleep(0.05)
    raise TimeoutError(f"deployment {deployment_id} is not READY")


def serving_function(model_dir: Path) -> Any:
    import tensorflow as tf

    return tf.saved_model.load(str(model_dir)).signatures["serving_default"]


def in_process(function: Any, batch: np.ndarray, seconds: float) -> Sample:
    """Call the loaded SavedModel's serving signature back to back in this process."""
    import tensorflow as tf

    for _ in range(10):
        function(x=tf.constant(batch))["y"].numpy()
    latencies = []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        function(x=tf.constant(batch))["y"].numpy()
        latencies.append(time.perf_counter() - now)
    return Sample(len(latencies) * len(batch) / (time.perf_counter() - start), latencies)


def through_endpoint(
    bench: Bench,
    url: str,
    deployment_id: str,
    batch: np.ndarray,
    concurrency: int,
    seconds: float,
) -> Sample:
    """`concurrency` clients, each posting {"instances": batch} as soon as it has its answer."""
    # Encoded once: the load generator shares the machine with the server.
    load = hammer(
        f"{url}/v1/deployments/{deployment_id}/predictions",
        method="POST",
        headers={**bench.headers, "Content-Type": "application/json"},
        body=orjson.dumps({"instances": batch.tolist()}),
        concurrency=concurrency,
        seconds=seconds,
    )
    return Sample(load.per_second * len(batch), load.latencies)


TFS_ROW = "scoring_rest_tfs_path_b64"
TFS_MODEL = "mlp"


def through_tfs_rest(
    bench: Bench,
    url: str,
    deployment_id: str,
    batch: np.ndarray,
    concurrency: int,
    seconds: float,
) -> Sample:
    """`concurrency` clients posting {"instances": batch} to TensorFlow Serving's path."""
    load = hammer(
        f"{url}/v1/models/{deployment_id}:predict",
        method="POST",
        headers={**bench.headers, "Content-Type": "application/json"},
        body=orjson.dumps({"instances": batch.tolist()}),
        concurrency=concurrency,
        seconds=seconds,
    )
    return Sample(load.per_second * len(batch), load.latencies)


def check_tfs_answers_as_rest(
    bench: Bench, url: str, deployment_id: str, batch: np.ndarray
) -> None:
    """TensorFlow Serving's path answers the platform route's numbers (1e-6)."""
    with bench.client(url) as http:
        body = {"instances": batch.tolist()}
        tfs = http.post(f"/v1/models/{deployment_id}:predict", json=body)
        rest = http.post(f"/v1/deployments/{deployment_id}/predictions", json=body)
        tfs.raise_for_status()
        rest.raise_for_status()
    np.testing.assert_allclose(
        np.asarray(tfs.json()["predictions"]),
        np.asarray(rest.json()["predictions"]),
        rtol=0,
        atol=1e-6,
    )


def tfs_rest_vs_in_process(
    bench: Bench, url: str, model: Model, deployment_id: str, model_dir: Path, args: Any
) -> Row:
    """`scoring_rest_tfs_path_b64`: batch-64 predictions/s through `:predict`, 4 clients,
    against the loaded model called back to back in-process, measured in turn."""
    batch = np.random.default_rng(0).uniform(-1, 1, size=(64, model.features))
    batch = batch.astype(np.float32)
    check_tfs_answers_as_rest(bench, url, deployment_id, batch)
    function = serving_function(model_dir)
    local: list[Sample] = []
    served: list[Sample] = []
    platform: list[Sample] = []
    paths = ((served, through_tfs_rest), (platform, through_endpoint))
    for repeat in range(args.repeats):
        local.append(in_process(function, batch, args.seconds))
        # The two paths take turns at following the in-process run (whose TensorFlow
        # threads keep spinning a moment after it), so neither always pays for it.
        for samples, through in paths if repeat % 2 == 0 else paths[::-1]:
            samples.append(
                through(bench, url, deployment_id, batch, THROUGHPUT_CONCURRENCY, args.seconds)
            )
    value, base, route = summarize(served), summarize(local), summarize(platform)
    return Row(
        TFS_ROW,
        round(value[0], 3),
        "predictions/s",
        baseline=round(base[0], 3),
        ratio=round(value[0] / base[0], 3),
        detail={
            "model": model.name,
            "batch": 64,
            "concurrency": THROUGHPUT_CONCURRENCY,
            "path": "POST /v1/models/{name}:predict",
            "p50_ms": round(value[1], 3),
            "p99_ms": round(value[2], 3),
            "platform_route_predictions_per_s": round(route[0], 3),
            "platform_route_ratio": round(route[0] / base[0], 3),
            "target": "ratio >= 0.8",
            "baseline": "the loaded model called back to back in-process",
        },
    ).emit()


def grpc_request(deployment_id: str, batch: np.ndarray) -> Any:
    """A TensorFlow Serving client's PredictRequest for `batch`."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = deployment_id
    request.model_spec.signature_name = "serving_default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(batch))
    return request


def check_grpc_answers_as_rest(
    bench: Bench, target: str, url: str, deployment_id: str, batch: np.ndarray
) -> int:
    """The numbers through PredictionServiceStub are the REST endpoint's (1e-6); the size
    of the answer's message on the wire (what every answer of the measured calls brings)."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = grpc_request(deployment_id, batch)
    metadata = [("authorization", bench.headers["Authorization"])]
    with grpc.insecure_channel(target) as channel, bench.client(url) as http:
        raw = channel.unary_unary(GRPC_PREDICT)(  # bytes in, bytes out: the wire's message
            request.SerializeToString(), metadata=metadata, timeout=60
        )
        rest = http.post(
            f"/v1/deployments/{deployment_id}/predictions", json={"instances": batch.tolist()}
        )
        rest.raise_for_status()
    answer = predict_pb2.PredictResponse.FromString(raw)
    got = tf.make_ndarray(answer.outputs["y"])
    np.testing.assert_allclose(got, np.asarray(rest.json()["predictions"]), rtol=0, atol=1e-6)
    return len(raw)


def through_grpc(
    bench: Bench,
    target: str,
    deployment_id: str,
    batch: np.ndarray,
    answer_bytes: int,
    concurrency: int,
    seconds: float,
) -> Sample:
    """`concurrency` calls of Predict in flight, each sent again as soon as it is answered
    (each answer checked to be a message of `answer_bytes`: `loadgen.hammer_grpc`)."""
    load = hammer_grpc(
        target,
        GRPC_PREDICT,
        request=grpc_request(deployment_id, batch).SerializeToString(),
        answer_bytes=answer_bytes,
        metadata=(("authorization", bench.headers["Authorization"]),),
        concurrency=concurrency,
        seconds=seconds,
    )
    return Sample(load.per_second * len(batch), load.latencies)


def endpoint_vs_in_process(
    bench: Bench, url: str, model: Model, deployment_id: str, model_dir: Path, args: Any
) -> list[Row]:
    """Per batch size: throughput with 1 and with 4 clients, and latency with 1 client,
    against the loaded model called back to back in this process."""
    rows = []
    rng = np.random.default_rng(0)
    function = serving_function(model_dir)
    for batch_size in (1, 64):
        batch = rng.uniform(-1, 1, size=(batch_size, model.features)).astype(np.float32)
        local, one, many, over_grpc = [], [], [], []
        target = bench.grpc_targets.get("grpc") if batch_size == 64 else None
        answer_bytes = 0
        if target is not None:
            answer_bytes = check_grpc_answers_as_rest(bench, target, url, deployment_id, batch)
        for _ in range(args.repeats):
            local.append(in_process(function, batch, args.seconds))
            one.append(through_endpoint(bench, url, deployment_id, batch, 1, args.seconds))
            with profiled(bench.processes["batching"].pid, f"rest-{model.name}-b{batch_size}"):
                many.append(
                    through_endpoint(
                        bench, url, deployment_id, batch, THROUGHPUT_CONCURRENCY, args.seconds
                    )
                )
            if target is not None:
                with profiled(bench.processes["grpc"].pid, f"grpc-{model.name}-{len(local)}"):
                    over_grpc.append(
                        through_grpc(
                            bench,
                            target,
                            deployment_id,
                            batch,
                            answer_bytes,
                            THROUGHPUT_CONCURRENCY,
                            args.seconds,
                        )
                    )
        base, c1, cn = summarize(local), summarize(one), summarize(many)
        if over_grpc:
            rows.append(grpc_row(model, batch_size, summarize(over_grpc), base, cn))
        prefix = f"scoring_{model.name}_b{batch_size}"
        measured = (
            ("predictions_per_s", "predictions/s", cn[0], base[0], THROUGHPUT_CONCURRENCY),
            ("c1_predictions_per_s", "predictions/s", c1[0], base[0], 1),
            ("p50", "ms", c1[1], base[1], 1),
            ("p99", "ms", c1[2], base[2], 1),
        )
        for name, unit, value, baseline, concurrency in measured:
            rows.append(
                Row(
                    f"{prefix}_{name}",
                    round(value, 3),
                    unit,
                    baseline=round(baseline, 3),
                    ratio=round(value / baseline, 3),
                    detail={
                        "model": model.name,
                        "batch": batch_size,
                        "concurrency": concurrency,
                        "baseline": "the loaded model called back to back in-process",
                    },
                ).emit()
            )
    return rows


def grpc_row(
    model: Model,
    batch_size: int,
    served: tuple[float, float, float],
    base: tuple[float, float, float],
    rest: tuple[float, float, float],
) -> Row:
    """`scoring_grpc_<model>_b64`: predictions/s through the gRPC API, 4 calls in flight,
    against the loaded model called back to back in-process; REST's ratio beside it."""
    return Row(
        f"scoring_grpc_{model.name}_b{batch_size}",
        round(served[0], 3),
        "predictions/s",
        baseline=round(base[0], 3),
        ratio=round(served[0] / base[0], 3),
        detail={
            "model": model.name,
            "batch": batch_size,
            "concurrency": THROUGHPUT_CONCURRENCY,
            "p50_ms": round(served[1], 3),
            "p99_ms": round(served[2], 3),
            "rest_predictions_per_s": round(rest[0], 3),
            "rest_ratio": round(rest[0] / base[0], 3),
            "target": "ratio >= 0.8",
            "baseline": "the loaded model called back to back in-process",
        },
    ).emit()


def batching_on_vs_off(bench: Bench, model: Model, deployment_id: str, args: Any) -> Row:
    """Batch-1 requests from 8 clients: the API batching, against the one that does not."""
    batch = np.random.default_rng(1).uniform(-1, 1, size=(1, model.features)).astype(np.float32)
    on, off = [], []
    for _ in range(args.repeats):
        for samples, name in ((on, "batching"), (off, "no-batching")):
            with profiled(bench.processes[name].pid, f"{name}-{model.name}-b1"):
                samples.append(
                    through_endpoint(
                        bench, bench.urls[name], deployment_id, batch, BATCHING_CONCURRENCY,
                        args.seconds,
                    )
                )  # fmt: skip
    value, baseline = summarize(on), summarize(off)
    return Row(
        f"scoring_{model.name}_batching_c{BATCHING_CONCURRENCY}_b1_requests_per_s",
        round(value[0], 3),
        "requests/s",
        baseline=round(baseline[0], 3),
        ratio=round(value[0] / baseline[0], 3),
        detail={
            "model": model.name,
            "batch": 1,
            "concurrency": BATCHING_CONCURRENCY,
            "p50_ms": round(value[1], 3),
            "baseline_p50_ms": round(baseline[1], 3),
            "baseline": "the same deployment on an API with DLAAS_SCORING_BATCHING=false",
        },
    ).emit()


def model_rows(model: Model) -> list[str]:
    """The rows measuring `model` (besides the headline rows, which are mlp's)."""
    prefix = f"scoring_{model.name}"
    return [
        f"scoring_grpc_{model.name}_b64",
        *(f"{prefix}_b{b}_{m}" for b in (1, 64) for m in ("predictions_per_s", "p50", "p99")),
        *(f"{prefix}_b{b}_c1_predictions_per_s" for b in (1, 64)),
        f"{prefix}_batching_c{BATCHING_CONCURRENCY}_b1_requests_per_s",
        *([TFS_ROW] if model.name == TFS_MODEL else []),
    ]


def models_for(rows: list[str] | None) -> tuple[Model, ...]:
    """The models whose rows match `rows` (names or shell patterns; None: all)."""
    if rows is None:
        return MODELS
    headline = any(fnmatch.fnmatchcase(h, p) for h in HEADLINE for p in rows)
    return tuple(
        m
        for m in MODELS
        if (headline and m.name == "mlp")
        or any(fnmatch.fnmatchcase(r, p) for r in model_rows(m) for p in rows)
    )


HEADLINE = ("scoring_batch64", "scoring_batching_gain")


def run(quick: bool, rows: list[str] | None = None) -> list[Row]:
    """Every scoring row, then the two headline rows of benchmarks/run.py: the "small dense
    model" is `mlp` (the tiny keras-single model's ratios are in their own rows). With
    `rows`, only the models those rows measure are trained and measured."""
    args = argparse.Namespace(seconds=1.0 if quick else 1.5, repeats=3 if quick else 5)
    if rows == [TFS_ROW]:  # TensorFlow Serving's REST path alone
        return run_tfs_only(args)
    rows_out = run_all(args, models_for(rows))
    return rows_out + headline_rows(rows_out)


def headline_rows(rows: list[Row]) -> list[Row]:
    by_name = {r.name: r for r in rows}
    if "scoring_mlp_b64_predictions_per_s" not in by_name:
        return []
    served = by_name["scoring_mlp_b64_predictions_per_s"]
    batching = by_name[f"scoring_mlp_batching_c{BATCHING_CONCURRENCY}_b1_requests_per_s"]
    ratios = {
        r.name: r.ratio
        for r in rows
        if r.name.endswith(("_b64_predictions_per_s", "_b1_requests_per_s"))
    }
    headline = []
    headline.append(
        Row(
            "scoring_batch64",
            served.value,
            served.unit,
            served.baseline,
            served.ratio,
            detail={"model": "mlp", "target": "ratio >= 0.8", "all_models": ratios},
        ).emit()
    )
    headline.append(
        Row(
            "scoring_batching_gain",
            batching.value,
            batching.unit,
            batching.baseline,
            batching.ratio,
            detail={"model": "mlp", "target": "ratio >= 2", "all_models": ratios},
        ).emit()
    )
    return headline


def run_all(args: Any, models: tuple[Model, ...] = MODELS) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dlaas-bench-scoring-") as tmp:
        bench = Bench(Path(tmp) / "home", catalog_file(Path(tmp)))
        try:
            url = bench.start_api("batching")
            bench.create_tenant(url)
            bench.spawn("worker", ["-m", "worker"])
            bench.spawn("monitor", ["-m", "worker.monitor"])
            with ThreadPoolExecutor(len(models)) as pool:  # trained side by side
                futures = [pool.submit(train_and_deploy, bench, url, m) for m in models]
                deployed = [f.result() for f in futures]
            bench.stop("worker")  # nothing else runs while we measure
            bench.stop("monitor")
            bench.start_api("no-batching", DLAAS_SCORING_BATCHING="false")
            bench.start_api("grpc", grpc=True)
            for api in ("no-batching", "grpc"):
                with bench.client(bench.urls[api]) as http:
                    for deployment_id, _ in deployed:
                        wait_ready(http, deployment_id)
            for model, (deployment_id, model_dir) in zip(models, deployed, strict=True):
                rows += endpoint_vs_in_process(bench, url, model, deployment_id, model_dir, args)
                rows.append(batching_on_vs_off(bench, model, deployment_id, args))
                if model.name == TFS_MODEL:
                    rows.append(
                        tfs_rest_vs_in_process(bench, url, model, deployment_id, model_dir, args)
                    )
        finally:
            bench.stop_all()
    return rows


def run_tfs_only(args: Any) -> list[Row]:
    """TFS_ROW alone: the one model trained and deployed on the batching API."""
    model = next(m for m in MODELS if m.name == TFS_MODEL)
    with tempfile.TemporaryDirectory(prefix="dlaas-bench-scoring-") as tmp:
        bench = Bench(Path(tmp) / "home", catalog_file(Path(tmp)))
        try:
            url = bench.start_api("batching")
            bench.create_tenant(url)
            bench.spawn("worker", ["-m", "worker"])
            bench.spawn("monitor", ["-m", "worker.monitor"])
            deployment_id, model_dir = train_and_deploy(bench, url, model)
            bench.stop("worker")
            bench.stop("monitor")
            return [tfs_rest_vs_in_process(bench, url, model, deployment_id, model_dir, args)]
        finally:
            bench.stop_all()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--rows", nargs="*", help="only the models these rows measure")
    parsed = parser.parse_args()
    run(parsed.quick, parsed.rows)
