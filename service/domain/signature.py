"""A SavedModel's signatures as plain data: what the API shows, what requests are checked
against, and what the database keeps (JSON). No TensorFlow here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = tuple[int | None, ...]


@dataclass(frozen=True)
class TensorInfo:
    """One input or output: its name, dtype (`float32`, `int64`, `string`, `bool`, ...) and
    shape (None for a dimension of any size; shape None for an unknown rank)."""

    name: str
    dtype: str
    shape: Shape | None

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
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorInfo:
        shape = data.get("shape")
        return cls(
            name=str(data["name"]),
            dtype=str(data["dtype"]),
            shape=None if shape is None else tuple(None if d is None else int(d) for d in shape),
        )


@dataclass(frozen=True)
class SignatureInfo:
    name: str
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]

    @property
    def batchable(self) -> bool:
        """Requests can be merged along the first dimension and their outputs split again."""
        return bool(self.inputs) and all(
            t.batched for t in (*self.inputs.values(), *self.outputs.values())
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "inputs": [t.as_json() for t in self.inputs.values()],
            "outputs": [t.as_json() for t in self.outputs.values()],
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> SignatureInfo:
        inputs = [TensorInfo.from_json(t) for t in data.get("inputs", [])]
        outputs = [TensorInfo.from_json(t) for t in data.get("outputs", [])]
        return cls(name, {t.name: t for t in inputs}, {t.name: t for t in outputs})


def signatures_to_json(signatures: Mapping[str, SignatureInfo]) -> dict[str, Any]:
    """The form kept in Deployment.signatures."""
    return {"signatures": {name: sig.as_json() for name, sig in sorted(signatures.items())}}


def signatures_from_json(data: Mapping[str, Any] | None) -> dict[str, SignatureInfo]:
    if not data:
        return {}
    raw: Mapping[str, Any] = data.get("signatures", {})
    return {name: SignatureInfo.from_json(name, sig) for name, sig in raw.items()}
