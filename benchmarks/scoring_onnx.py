"""Online scoring of an ONNX model: batch-64 predictions through the REST endpoint (its model
in the sandboxed model process, under ONNX Runtime) against ONNX Runtime called back to
back in this process on the same `model.onnx`.

    python benchmarks/scoring_onnx.py [--quick]

A training through the platform (its `platform` runtime, where the `onnx` extra is
installed) writes an ONNX model of benchmarks/scoring.py's `mlp` shape (32 inputs,
4 x 1024 relu, 10 outputs; random weights) to `$RESULT_DIR/model/model.onnx`, with
`onnx.helper`; it is deployed and measured with 4 clients, in turn with the in-process
baseline in each repeat. Row `scoring_onnx_b64`: predictions/s, ratio target >= 0.8.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, profiled, zip_code
from benchmarks.scoring import (
    THROUGHPUT_CONCURRENCY,
    Bench,
    Model,
    Sample,
    catalog_file,
    summarize,
    through_endpoint,
    train_and_deploy,
)

ONNX_MLP_CODE = """\
import os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

inputs, width, depth = (int(a) for a in sys.argv[1:4])
rng = np.random.default_rng(0)
nodes, weights, previous, size = [], [], "x", inputs
for i in range(depth + 1):
    out = 10 if i == depth else width
    w = (rng.standard_normal((size, out)) / np.sqrt(size)).astype(np.float32)
    b = np.zeros(out, np.float32)
    weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
    nodes += [helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]),
              helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}" if i < depth else "y"])]
    if i < depth:
        nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
        previous = f"h{i}"
    size = out
graph = helper.make_graph(
    nodes, "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
    weights,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
out = os.path.join(os.environ["RESULT_DIR"], "model")
os.makedirs(out, exist_ok=True)
onnx.save(model, os.path.join(out, "model.onnx"))
print("saved", out, flush=True)
"""

MODEL = Model("onnx-mlp", 32, "python3 export.py 32 1024 4", zip_code({"export.py": ONNX_MLP_CODE}))


def in_process(session: object, batch: np.ndarray, seconds: float) -> Sample:
    """ONNX Runtime's session on the same model.onnx, called back to back."""
    run = session.run  # type: ignore[attr-defined]
    for _ in range(10):
        run(["y"], {"x": batch})
    latencies = []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        run(["y"], {"x": batch})
        latencies.append(time.perf_counter() - now)
    return Sample(len(latencies) * len(batch) / (time.perf_counter() - start), latencies)


def run(quick: bool) -> list[Row]:
    import onnxruntime as ort

    seconds, repeats = (1.0, 3) if quick else (1.5, 5)
    with tempfile.TemporaryDirectory(prefix="dlaas-bench-onnx-") as tmp:
        bench = Bench(Path(tmp) / "home", catalog_file(Path(tmp)))
        try:
            url = bench.start_api("batching")
            bench.create_tenant(url)
            bench.spawn("worker", ["-m", "worker"])
            bench.spawn("monitor", ["-m", "worker.monitor"])
            deployment_id, model_dir = train_and_deploy(bench, url, MODEL)
            bench.stop("worker")  # nothing else runs while we measure
            bench.stop("monitor")
            session = ort.InferenceSession(
                str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"]
            )
            batch = np.random.default_rng(0).uniform(-1, 1, size=(64, 32)).astype(np.float32)
            local, served = [], []
            for _ in range(repeats):
                local.append(in_process(session, batch, seconds))
                with profiled(bench.processes["batching"].pid, "rest-onnx-mlp-b64"):
                    served.append(
                        through_endpoint(
                            bench, url, deployment_id, batch, THROUGHPUT_CONCURRENCY, seconds
                        )
                    )
        finally:
            bench.stop_all()
    value, base = summarize(served), summarize(local)
    return [
        Row(
            "scoring_onnx_b64",
            round(value[0], 3),
            "predictions/s",
            baseline=round(base[0], 3),
            ratio=round(value[0] / base[0], 3),
            detail={
                "model": MODEL.name,
                "batch": 64,
                "concurrency": THROUGHPUT_CONCURRENCY,
                "p50_ms": round(value[1], 3),
                "baseline_p50_ms": round(base[1], 3),
                "target": "ratio >= 0.8",
                "baseline": "ONNX Runtime on the same model.onnx, called back to back in-process",
            },
        ).emit()
    ]


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    run(parser.parse_args().quick)
