"""FfDL's jobs brought unchanged, on the local backend through the REST API: an FfDL
manifest whose launcher works as FfDL's tf-distributed one does (hosts
`<prefix>-<i>.<prefix>:2222` from i = 0, PS_HOSTS_COUNT, task_index = LEARNER_ID - 1 - ps,
run as `./launcher.py` from a zip that packs it 0755) completes on 1 parameter server and 1
worker; the TensorFlow 1.x script it runs fails unported, pointing to the porting notes, and
completes ported (examples/ffdl-tf-distributed); an FfDL Horovod manifest runs its script
on 2 ranks."""

from __future__ import annotations

import gzip
import io
import re
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from service import runtimes
from tests.integration.platform_harness import (
    EXAMPLES,
    RUNTIMES_DIR,
    LivePlatform,
    live_platform,
)

pytestmark = pytest.mark.integration

pytest.importorskip("tensorflow", reason="install the tensorflow extra")

HERE = Path(__file__).resolve().parent
PORTED = EXAMPLES / "ffdl-tf-distributed"
UNPORTED_SCRIPT = HERE / "ffdl_tf1" / "mnist_dist.py"

FFDL_MANIFEST = """\
name: Distributed-tensorflow-mnist
description: Distributed MNIST, FfDL's tf-distributed way
version: "1.0"
gpus: 0
memory: 1GiB
cpus: 1
learners: 2

framework:
  name: tensorflow
  version: "1.5.0-py3"
  command: >-
    PS_HOSTS_COUNT=1 ./launcher.py python3 mnist_dist.py
    --data_dir ${MODEL_DIR}/mnist-sample --model_dir ${RESULT_DIR} --steps 40
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePlatform]:
    home = tmp_path_factory.mktemp("ffdl")
    with live_platform(home / "home", f"sqlite:///{home / 'dlaas.db'}") as p:
        yield p


def _idx(array: np.ndarray) -> bytes:
    """MNIST's idx format, gzipped, as FfDL's examples keep their data."""
    header = b"\x00\x00\x08" + bytes([array.ndim])
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def mnist_sample() -> dict[str, bytes]:
    """A tiny MNIST-shaped data set (a label's digit is a bright band at its row)."""
    rng = np.random.default_rng(0)
    files = {}
    for images, labels, count in (
        ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 256),
        ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 64),
    ):
        digits = rng.integers(0, 10, count)
        pictures = np.zeros((count, 28, 28))
        for i, digit in enumerate(digits):
            pictures[i, digit * 2 : digit * 2 + 3, :] = 255
        files[f"mnist-sample/{images}"] = _idx(pictures)
        files[f"mnist-sample/{labels}"] = _idx(digits)
    return files


def code_zip(script: Path = PORTED / "mnist_dist.py") -> bytes:
    """The code as an FfDL user zips it: launcher.py packed 0755 (its Unix mode in the
    zip's external_attr), the rest 0644."""
    files: dict[str, tuple[bytes, int]] = {
        name: ((PORTED / name).read_bytes(), 0o644)
        for name in ("contrib_layers.py", "mnist_input.py")
    }
    files["launcher.py"] = ((PORTED / "launcher.py").read_bytes(), 0o755)
    files["mnist_dist.py"] = (script.read_bytes(), 0o644)
    files.update({name: (data, 0o644) for name, data in mnist_sample().items()})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


def ffdl_manifest() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(FFDL_MANIFEST)
    return doc


def test_an_ffdl_tf_distributed_job_completes_with_ffdl_naming(live: LivePlatform) -> None:
    t = live.submit(ffdl_manifest(), code_zip())
    assert t["manifest"]["conventions"] == "ffdl"
    assert t["compute_configuration"] == {"name": "P100", "nodes": 2}
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-4000:])
    prefix = f"learner-{t['id']}"
    ps_host, worker_host = f"{prefix}-0.{prefix}:2222", f"{prefix}-1.{prefix}:2222"
    # Learner 1 (LEARNER_ID 1) is host -0, the parameter server; learner 2 is -1, worker 0.
    assert "[learner 1] launching learner 1 as ps 0" in logs
    assert "[learner 2] launching learner 2 as worker 0" in logs
    assert f"--ps_hosts={ps_host} --worker_hosts={worker_host}" in logs
    assert re.search(r"\[learner 2\] worker 0 accuracy=[0-9.]+", logs)
    assert "model.ckpt.index" in live.results(t["id"])


def test_the_unported_tensorflow1_script_fails_pointing_to_the_porting_notes(
    live: LivePlatform,
) -> None:
    t = live.submit(ffdl_manifest(), code_zip(UNPORTED_SCRIPT))
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    assert done["status"] == "FAILED", done
    message = done["status_message"]
    assert "the script imports tensorflow.examples" in message, message
    assert "README.md, 'Porting TensorFlow 1.x scripts'" in message
    assert "ModuleNotFoundError: No module named 'tensorflow.examples'" in live.logs(t["id"])


def test_ported_with_the_fewest_changes() -> None:
    """The ported script differs from the TensorFlow 1.x one in its docstring, its three
    imports and the tf.contrib.layers prefix alone."""
    import difflib

    original = UNPORTED_SCRIPT.read_text().split('"""')[2].splitlines()
    ported = (PORTED / "mnist_dist.py").read_text().split('"""')[2].splitlines()
    changed = [
        line
        for line in difflib.unified_diff(original, ported, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "-import tensorflow as tf",
        "-from tensorflow.examples.tutorials.mnist import input_data",
        "+import contrib_layers",
        "+import mnist_input as input_data",
        "+import tensorflow.compat.v1 as tf",
        "+",
        "+tf.disable_v2_behavior()",
        "-        hidden = tf.contrib.layers.fully_connected(",
        "-            x, 64, weights_initializer=tf.contrib.layers.xavier_initializer()",
        "+        hidden = contrib_layers.fully_connected(",
        "+            x, 64, weights_initializer=contrib_layers.xavier_initializer()",
        "-        logits = tf.contrib.layers.fully_connected(hidden, 10, activation_fn=None)",
        "+        logits = contrib_layers.fully_connected(hidden, 10, activation_fn=None)",
    ]


HOROVOD_MANIFEST = """\
name: Distributed-horovod-tensorflow
description: FfDL's Horovod example's form
version: "1.0"
gpus: 0
cpus: 1
memory: 1Gb
learners: 2

framework:
  name: horovod
  version: "0.13.10-tf1.9.0-torch0.4.0-py3.5"
  command: python train_hvd.py --steps 20
"""


def test_an_ffdl_horovod_job_runs_its_script_on_two_ranks(live: LivePlatform) -> None:
    # Built by `dlaas runtimes install horovod-tf2.14` (or tests/integration/test_horovod.py);
    # not built here, where another build of it may be running.
    if runtimes.installed(RUNTIMES_DIR, "horovod-tf2.14") is None:
        pytest.skip(f"the horovod-tf2.14 runtime is not built in {RUNTIMES_DIR}")
    t = live.submit(yaml.safe_load(HOROVOD_MANIFEST), EXAMPLES / "horovod-tf2")
    assert t["framework"] == {"name": "tensorflow-horovod", "version": "1.5"}
    done = live.wait_for(t["id"], {"COMPLETED", "FAILED"}, timeout=600)
    logs = live.logs(t["id"])
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    prefix = f"learner-{t['id']}"
    # FfDL's naming: the ranks' hosts are -0 and -1.
    assert re.search(rf"rank=0 size=2 host={prefix}-0\b", logs), logs[-3000:]
    assert re.search(rf"rank=1 size=2 host={prefix}-1\b", logs), logs[-3000:]
