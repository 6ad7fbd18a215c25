"""benchmarks/run.py: every row of the suite belongs to a benchmark file, and --rows runs
only the files (and, in scoring, the models) that measure the rows asked for."""

from __future__ import annotations

import pytest

from benchmarks import run, scoring
from benchmarks.common import Row


def test_every_row_names_a_benchmark_file_of_the_suite() -> None:
    assert set(run.ROWS.values()) <= set(run.BENCHMARKS)
    for row in (
        "hvd_synthetic_overhead",
        "scoring_rest_tfs_path_b64",
        "pytorch_ddp_overhead",
        "scoring_onnx_b64",
        "metrics_read_large_over_small",
        "k8s_gpu_utilisation",
    ):
        assert row in run.ROWS  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "files"),
    [
        (["scoring_grpc_keras-single_b64"], ["scoring"]),
        (["log_throughput", "submit_throughput"], ["log_throughput", "submit_throughput"]),
        (["scoring_keras-single_b64_*"], ["scoring"]),
        (["k8s_*"], ["k8s"]),
        (["no_such_row"], []),
    ],
)
def test_rows_choose_their_files(rows: list[str], files: list[str]) -> None:
    assert run.files_for(rows) == files


def test_scoring_measures_only_the_models_its_rows_name() -> None:
    names = lambda rows: [m.name for m in scoring.models_for(rows)]  # noqa: E731
    assert names(["scoring_grpc_keras-single_b64"]) == ["keras-single"]
    assert names(["scoring_batching_gain"]) == ["mlp"]
    assert names(["scoring_wide_b1_p99", "scoring_grpc_mlp_b64"]) == ["mlp", "wide"]
    assert names(None) == [m.name for m in scoring.MODELS]


def test_the_summary_says_why_a_row_has_no_figure(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [Row("log_throughput", 1.0, "lines/s", ratio=1.24)]
    run.summary(rows, ["log_throughput", "api"], ["api"], [], None)
    out = {
        line.split()[0]: line.split(None, 1)[1] for line in capsys.readouterr().err.splitlines()[1:]
    }
    assert out["log_throughput"] == "1.24"
    assert out["api_get_training"] == "not measured: benchmarks/api.py failed"
    assert out["training_overhead"] == "not measured: not asked for"
    assert out["pytorch_ddp_overhead"] == "not measured: not asked for"


def test_a_file_s_end_line_says_what_the_hypervisor_took() -> None:
    assert run.finished(61.4, 0.123) == "61 s, steal 12.3% of the CPUs' time"
    assert run.finished(61.4, None) == "61 s"
