"""A loaded SavedModel. The only module of the service that imports TensorFlow, and only
when a model is loaded: the API process of a cluster, whose scoring runs elsewhere, never
does."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from service.domain.signature import SignatureInfo, TensorInfo
from service.memory import settle_memory

_import_lock = threading.Lock()


class ModelInputError(ValueError):
    """The model refused the inputs (TensorFlow's InvalidArgumentError): the caller's fault,
    answered with a 400."""


def tensorflow() -> ModuleType:
    with _import_lock:
        first = "tensorflow" not in sys.modules
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        module = importlib.import_module("tensorflow")
        if first:
            settle_memory()  # TensorFlow's own objects live as long as the process
        return module


def _tensor_info(name: str, spec: Any) -> TensorInfo:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorInfo(name=name, dtype=spec.dtype.name, shape=shape)


def _describe(name: str, function: Any) -> SignatureInfo:
    args, kwargs = function.structured_input_signature
    if args:
        raise ValueError(f"signature '{name}' takes positional inputs; signatures name them")
    outputs = function.structured_outputs
    if not isinstance(outputs, Mapping):
        raise ValueError(f"signature '{name}' does not return named outputs")
    return SignatureInfo(
        name,
        {n: _tensor_info(n, spec) for n, spec in sorted(kwargs.items())},
        {n: _tensor_info(n, spec) for n, spec in sorted(outputs.items())},
    )


def _example(info: TensorInfo) -> np.ndarray:
    """One instance of zeros (empty strings) in the shape of `info`, open dimensions 1."""
    shape = tuple(1 if d is None else d for d in (info.shape or (1,)))
    if info.dtype == "string":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=np.dtype(info.dtype))


class LoadedModel:
    """A SavedModel's signatures, described and callable with numpy arrays."""

    def __init__(self, path: Path) -> None:
        self._tf = tensorflow()
        self._model = self._tf.saved_model.load(str(path))
        self._functions: dict[str, Any] = dict(self._model.signatures)
        self.signatures = {n: _describe(n, f) for n, f in sorted(self._functions.items())}

    def call(self, signature: str, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        function = self._functions[signature]
        try:
            outputs = function(**{n: tf.convert_to_tensor(t) for n, t in tensors.items()})
        except (tf.errors.InvalidArgumentError, TypeError, ValueError) as e:
            message = getattr(e, "message", None) or str(e)
            raise ModelInputError(message.strip().splitlines()[0]) from e
        return {n: t.numpy() for n, t in outputs.items()}

    def warm_up(self, signature: str) -> None:
        """Call the signature once with zeros, so the first request does not pay for the
        first call (and a model that cannot answer fails to deploy instead)."""
        inputs = self.signatures[signature].inputs
        self.call(signature, {n: _example(t) for n, t in inputs.items()})
