"""tf.Example from TensorFlow Serving's JSON, and the serialized examples that a Classify
or Regress signature takes. Pure: protobuf messages, no TensorFlow.

TensorFlow Serving's REST API writes an Example as a JSON object of features, each a
value or a list of values: strings (and `{"b64": ...}`) are a bytes_list, whole numbers
and booleans an int64_list, other numbers a float_list; one feature's values are of one
kind. A request's `context` is an Example whose features every example gets (an example's
own feature of the same name wins), as TensorFlow Serving's ExampleListWithContext.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np

from service.scoring.arrays import InvalidPayload

_INT64 = np.iinfo(np.int64)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# A feature's kind, as TensorFlow Serving's messages name it.
_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _kind_and_value(value: Any, name: str, field: str) -> tuple[str, Any]:
    if isinstance(value, bool):
        return "int64_list", int(value)
    if isinstance(value, str):
        return "bytes_list", value.encode()
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return "bytes_list", base64.b64decode(value["b64"], validate=True)
        except binascii.Error as e:
            raise InvalidPayload(field, "Unable to base64 decode") from e
    if isinstance(value, int):
        if not _INT64.min <= value <= _INT64.max:
            raise InvalidPayload(
                field, f"Feature: {name} has uint64 element. Only int64 is supported."
            )
        return "int64_list", value
    if isinstance(value, float):
        if abs(value) > _FLOAT32_MAX and value == value and abs(value) != float("inf"):
            raise InvalidPayload(
                field, f"Cannot convert JSON value: {value} to float without loss of precision."
            )
        return "float_list", value
    raise InvalidPayload(
        field, f"Feature: {name} has element with unexpected JSON type: {_json_type(value)}"
    )


def example_from_json(value: Any, field: str, example_class: Any) -> Any:
    """The tf.Example message (of `example_class`) that the JSON object `value` writes;
    InvalidPayload naming `field` when it is not one."""
    if not isinstance(value, dict):
        raise InvalidPayload(field, f"Example must be JSON object but got JSON {_json_type(value)}")
    example = example_class()
    for name, content in value.items():
        feature = example.features.feature[name]
        kind: str | None = None
        values: list[Any] = []
        for item in content if isinstance(content, list) else [content]:
            item_kind, item_value = _kind_and_value(item, name, f"{field}/{name}")
            if kind is not None and item_kind != kind:
                raise InvalidPayload(
                    f"{field}/{name}",
                    f"Unexpected element type in feature: {name} expecting type: "
                    f"{_KIND_NAMES[kind]}",
                )
            kind = item_kind
            values.append(item_value)
        if kind is not None:
            getattr(feature, kind).value.extend(values)
    return example


def serialized_examples(examples: Sequence[Any], context: Any | None = None) -> list[bytes]:
    """Each example serialized, after the context's bytes when there is one: a message's
    bytes followed by another's parse as the two merged, the later's fields winning."""
    prefix = context.SerializeToString() if context is not None else b""
    return [prefix + example.SerializeToString() for example in examples]


def examples_from_request(payload: dict[str, Any], example_class: Any) -> list[bytes]:
    """The serialized examples of a REST classify or regress body (`examples`, and
    `context` where given)."""
    context = None
    if "context" in payload:
        context = example_from_json(payload["context"], "/context", example_class)
    if "examples" not in payload:
        raise InvalidPayload("/examples", "key 'examples' is expected and was not found")
    raw = payload["examples"]
    if not isinstance(raw, list):
        raise InvalidPayload("/examples", "Expecting 'examples' value to be an list/array")
    if not raw:
        raise InvalidPayload("/examples", "'examples' value is an empty array")
    examples = [example_from_json(e, f"/examples/{i}", example_class) for i, e in enumerate(raw)]
    return serialized_examples(examples, context)
