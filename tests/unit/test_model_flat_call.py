"""The model process's flat call of a SavedModel signature (service/scoring/model_server.py,
`FlatCall`): after warm-up, a Predict signature whose inputs are plain tensors is called in
the function's own order, past TensorFlow's binding of keyword arguments; it answers what
the structured call answers, and inputs of another dtype or shape (and signatures it cannot
call flat) go the structured way, with its errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.scoring import model_server

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two inputs (not in alphabetical order in the function), two outputs, a fixed
    dimension and an open one; a second signature that takes a string."""

    class Module(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 3], tf.float32, name="b_values"),
                tf.TensorSpec([None], tf.int32, name="a_offset"),
            ]
        )
        def serve(self, b_values: Any, a_offset: Any) -> dict[str, Any]:
            y = tf.matmul(b_values, self.w) + tf.cast(a_offset, tf.float32)[:, None]
            return {"y": y, "total": tf.reduce_sum(y, axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def lengths(self, text: Any) -> dict[str, Any]:
            return {"n": tf.strings.length(text)}

    module = Module()
    path = tmp_path_factory.mktemp("flat") / "model"
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": module.serve, "lengths": module.lengths}
    )
    return path


def _counting(model: model_server.Model, signature: str) -> list[int]:
    """Count the flat calls that reach TensorFlow."""
    flat = model._flat[signature]
    calls: list[int] = []
    inner = flat._call

    def call(*args: Any) -> Any:
        calls.append(1)
        return inner(*args)

    flat._call = call
    return calls


def test_a_warmed_up_signature_is_called_flat_and_answers_as_the_structured_call(
    model_dir: Path,
) -> None:
    model = model_server.Model(model_dir)
    assert model._flat == {}
    model.warm_up("serving_default")
    assert set(model._flat) == {"serving_default"}
    calls = _counting(model, "serving_default")
    inputs = {
        "b_values": np.arange(12, dtype=np.float32).reshape(4, 3),
        "a_offset": np.array([0, 1, 2, 3], dtype=np.int32),
    }
    got = model.call("serving_default", inputs)
    assert calls == [1]
    function = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    expected = {k: v.numpy() for k, v in function(**inputs).items()}
    assert got.keys() == expected.keys() == {"y", "total"}
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
        assert got[name].dtype == expected[name].dtype


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param(
            {"b_values": np.zeros((2, 3), np.float64), "a_offset": np.zeros(2, np.int32)},
            id="another dtype",
        ),
        pytest.param(
            {"b_values": np.zeros((2, 4), np.float32), "a_offset": np.zeros(2, np.int32)},
            id="another fixed dimension",
        ),
        pytest.param(
            {"b_values": np.zeros((2, 3, 1), np.float32), "a_offset": np.zeros(2, np.int32)},
            id="another rank",
        ),
        pytest.param({"b_values": np.zeros((2, 3), np.float32)}, id="an input missing"),
    ],
)
def test_other_inputs_take_the_structured_call_and_its_refusal(
    model_dir: Path, inputs: dict[str, np.ndarray]
) -> None:
    model = model_server.Model(model_dir)
    model.warm_up("serving_default")
    calls = _counting(model, "serving_default")
    with pytest.raises(model_server.InputRefused) as flat_error:
        model.call("serving_default", inputs)
    assert calls == []
    unwarmed = model_server.Model(model_dir)
    with pytest.raises(model_server.InputRefused) as structured_error:
        unwarmed.call("serving_default", inputs)
    # The same refusal (TensorFlow numbers each load's functions apart).
    assert _unnumbered(flat_error.value) == _unnumbered(structured_error.value)


def _unnumbered(error: BaseException) -> str:
    return re.sub(r"_\d+\b", "", str(error))


def test_a_signature_of_strings_is_not_called_flat(model_dir: Path) -> None:
    function = tf.saved_model.load(str(model_dir)).signatures["lengths"]
    assert model_server.FlatCall.of(tf, function) is None
    model = model_server.Model(model_dir)
    model.warm_up("serving_default")
    assert "lengths" not in model._flat
    got = model.call("lengths", {"text": np.array([b"ab", b"abcd"], dtype=object)})
    np.testing.assert_array_equal(got["n"], [2, 4])


def test_a_flat_call_that_answers_otherwise_is_not_kept(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up compares the two ways; a TensorFlow whose flat call differs keeps the
    structured one."""
    real = model_server.FlatCall.__call__

    def off_by_one(self: model_server.FlatCall, tensors: Any) -> Any:
        outputs = real(self, tensors)
        return {k: v + 1 for k, v in outputs.items()}

    monkeypatch.setattr(model_server.FlatCall, "__call__", off_by_one)
    model = model_server.Model(model_dir)
    model.warm_up("serving_default")
    assert model._flat == {}


def test_a_function_without_a_flat_call_is_called_as_before(model_dir: Path) -> None:
    class Structured:
        structured_input_signature = ((), {"x": tf.TensorSpec([None], tf.float32)})
        structured_outputs = {"y": tf.TensorSpec([None], tf.float32)}

    assert model_server.FlatCall.of(tf, Structured()) is None
