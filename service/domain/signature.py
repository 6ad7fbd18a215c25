"""A SavedModel's signatures as plain data: what the API shows, what requests are checked
against, and what the database keeps (JSON). No TensorFlow here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = tuple[int | None, ...]

# A SignatureDef's method_name: TensorFlow Serving's Predict, Classify and Regress APIs.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"


@dataclass(frozen=True)
class TensorInfo:
    """One input or output: its name, dtype (`float32`, `int64`, `string`, `bool`, ...) and
    shape (None for a dimension of any size; shape None for an unknown rank); `tensor`, the
    graph's tensor the SavedModel's SignatureDef maps it to (`serving_default_x:0`; empty
    when not known)."""

    name: str
    dtype: str
    shape: Shape | None
    tensor: str = ""

    @property
    def batched(self) -> bool:
        """Whether the first dimension is a batch dimension of any size."""
        return self.shape is not None and len(self.shape) >= 1 and self.shape[0] is None

    def describe(self) -> str:
        """`float32 [None, 2]`, as error messages show it."""
        if self.shape is None:
            return f"{self.dtype} of any shape"
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype} [{dims}]"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }
        if self.tensor:
            data["tensor_name"] = self.tensor
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorInfo:
        shape = data.get("shape")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=None if shape is None else tuple(None if d is None else int(d) for d in shape),
            tensor=str(data.get("tensor_name") or ""),
        )


@dataclass(frozen=True)
class SignatureInfo:
    """One signature: its inputs and outputs by key, and its SignatureDef's method_name
    (what TensorFlow Serving's API may call it with; tf.saved_model.save writes
    PREDICT_METHOD)."""

    name: str
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    method: str = PREDICT_METHOD

    @property
    def batchable(self) -> bool:
        """Requests can be merged along the first dimension and their outputs split again."""
        return bool(self.inputs) and all(
            t.batched for t in (*self.inputs.values(), *self.outputs.values())
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "method_name": self.method,
            "inputs": [t.as_json() for t in self.inputs.values()],
            "outputs": [t.as_json() for t in self.outputs.values()],
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> SignatureInfo:
        inputs = [TensorInfo.from_json(t) for t in data.get("inputs", [])]
        outputs = [TensorInfo.from_json(t) for t in data.get("outputs", [])]
        method = str(data.get("method_name") or PREDICT_METHOD)
        return cls(name, {t.name: t for t in inputs}, {t.name: t for t in outputs}, method)


def signatures_to_json(signatures: Mapping[str, SignatureInfo]) -> dict[str, Any]:
    """The form kept in Deployment.signatures."""
    return {"signatures": {name: sig.as_json() for name, sig in sorted(signatures.items())}}


def signatures_from_json(data: Mapping[str, Any] | None) -> dict[str, SignatureInfo]:
    if not data:
        return {}
    raw: Mapping[str, Any] = data.get("signatures", {})
    return {name: SignatureInfo.from_json(name, sig) for name, sig in raw.items()}
