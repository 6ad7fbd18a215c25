"""SavedModels with TensorFlow Serving's Classify and Regress signatures, built with
TensorFlow 1's SignatureDef builders (`tf.compat.v1.saved_model`), as Estimators export
them; with `tf.saved_model.save` every signature is a Predict one.

- `multi`: serving_default (Predict: x float [None, 2] -> y = 3*x1 - 2*x2 + 0.5),
  regress_x_to_y (Regress: tf.Examples with feature x -> outputs = y) and
  classify_x_to_y (Classify, scores only: sigmoid(y));
- `classifier`: serving_default is a Classify signature: tf.Examples with features x
  (float [2]) and bias (float, default 0) -> scores = softmax(x @ W + bias), classes
  ["cat", "dog", "owl"] for every example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

W = np.array([[3.0], [-2.0]], dtype=np.float32)
CLASS_W = np.array([[1.0, -1.0, 0.5], [0.0, 2.0, -0.5]], dtype=np.float32)
LABELS = [b"cat", b"dog", b"owl"]


def build_multi(tf: Any, path: Path) -> None:
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        examples = v1.placeholder(tf.string, [None], name="tf_example")
        parsed = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([2], tf.float32)})
        x = v1.placeholder(tf.float32, [None, 2], name="x")

        def line(t: Any) -> Any:
            return tf.matmul(t, tf.constant(W)) + 0.5

        y = tf.identity(line(x), name="y")
        regressed = tf.identity(tf.reshape(line(parsed["x"]), [-1]), name="y_regress")
        score = tf.identity(tf.sigmoid(line(parsed["x"])), name="score")
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(str(path))
            signatures = {
                "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y}),
                "regress_x_to_y": v1.saved_model.regression_signature_def(examples, regressed),
                "classify_x_to_y": v1.saved_model.classification_signature_def(
                    examples, None, score
                ),
            }
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
            builder.save()


def build_classifier(tf: Any, path: Path) -> None:
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        examples = v1.placeholder(tf.string, [None], name="input_example_tensor")
        parsed = tf.io.parse_example(
            examples,
            {
                "x": tf.io.FixedLenFeature([2], tf.float32),
                "bias": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            },
        )
        logits = tf.matmul(parsed["x"], tf.constant(CLASS_W)) + parsed["bias"]
        scores = tf.nn.softmax(logits, name="probabilities")
        batch = tf.shape(examples)[0]
        classes = tf.tile(tf.constant([LABELS]), [batch, 1], name="class_names")
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(str(path))
            signatures = {
                "serving_default": v1.saved_model.classification_signature_def(
                    examples, classes, scores
                )
            }
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
            builder.save()


def run_signature(tf: Any, path: Path, signature: str, **inputs: Any) -> dict[str, np.ndarray]:
    """What TensorFlow itself computes for a signature of the SavedModel (the numbers
    TensorFlow Serving, which runs the same kernels, answers with)."""
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}
