"""The wire format between the scoring service and a model process (model_server.py):
frames of a header and raw array bytes, written and read over a connected Unix socket.

The model process loads this file by its path (`python -I` puts nothing of the platform
on its import path), so it imports only the standard library and numpy; the scoring
service imports it as `service.scoring.model_wire`.

Every message is a frame: a 12-byte
prefix (header length u32, body length u64, little-endian), a header, and a body of raw
array bytes. The header lists the arrays (`tensors`: name, dtype, shape, nbytes) in the
order of their bytes in the body; numbers are little-endian, strings an array of u64
lengths followed by the bytes. The start-up conversation's headers are JSON objects; the
calls and their answers have a binary header of a few bytes (`encode_call`,
`encode_result`, `encode_error`: an op byte, the signature's name or the error, then per
tensor its name, dtype code, dimensions and byte count), read into the same shape as the
JSON ones. Nothing is pickled or parsed as JSON per call; the receiving end checks every
length, dtype and shape before it makes an array of a frame, and the numbers' bytes are
used where they lie in the frame (numpy views, not copies).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

PREFIX = struct.Struct("<IQ")
# The array dtypes that cross (numpy's names; TensorFlow's are the same).
DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "string",
    }
)
MAX_DIMS = 32
# Largest header of a call or an answer, and of the graph's description.
MAX_HEADER = 1024 * 1024
MAX_GRAPH_HEADER = 256 * 1024 * 1024
# Largest body of a call or an answer.
MAX_BODY = 1024 * 1024 * 1024
_LENGTH = np.dtype("<u8")
# Wire name -> the little-endian dtype of its bytes, and back (numpy's dtype.name is slow).
_WIRE = {name: np.dtype(name).newbyteorder("<") for name in DTYPES if name != "string"}
_NAMES = {dtype: name for name, dtype in _WIRE.items()}


# Binary headers: the op, then what it carries (see encode_call and _binary_header).
_CALL, _RESULT, _ERROR = 1, 2, 3
_ERROR_KINDS = ("input", "model")
_DTYPE_CODES = tuple(sorted(DTYPES))
_CODE_OF = {name: i for i, name in enumerate(_DTYPE_CODES)}
_U8, _U16, _U64 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<Q")
_TENSOR_HEAD = struct.Struct("<BB")  # dtype code, dimensions
_TENSOR_TAIL = struct.Struct("<Q")  # nbytes


class WireError(ValueError):
    """A frame that does not follow the format (or its limits)."""


class Closed(ConnectionError):
    """The other end closed the socket."""


Frame = list[bytes | memoryview]


def _raw(array: np.ndarray) -> tuple[str, list[bytes | memoryview], int]:
    """The wire dtype and bytes of `array`."""
    if array.dtype.kind in "OSU":
        values = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        lengths = np.fromiter((len(v) for v in values), dtype=_LENGTH, count=len(values))
        data = b"".join(values)
        return "string", [lengths.tobytes(), data], lengths.nbytes + len(data)
    name = _NAMES.get(array.dtype) or _NAMES.get(array.dtype.newbyteorder("<"))
    if name is None:
        raise WireError(f"arrays of dtype {array.dtype.name} cannot be sent")
    little = np.ascontiguousarray(array, dtype=_WIRE[name])
    return name, [little.reshape(-1).view(np.uint8).data], little.nbytes


def encode(header: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None) -> Frame:
    """A frame of `header` and `tensors`, as the buffers to send."""
    specs: list[dict[str, Any]] = []
    buffers: list[bytes | memoryview] = []
    body = 0
    for name, value in (tensors or {}).items():
        array = np.asarray(value)
        dtype, raw, nbytes = _raw(array)
        specs.append({"name": name, "dtype": dtype, "shape": list(array.shape), "nbytes": nbytes})
        buffers += raw
        body += nbytes
    text = json.dumps({**header, "tensors": specs}, separators=(",", ":")).encode()
    return [PREFIX.pack(len(text), body), text, *buffers]


def _tensors(
    tensors: Mapping[str, np.ndarray],
) -> tuple[list[bytes], list[bytes | memoryview], int]:
    """The binary tensor list of a header (count first), the buffers and their length."""
    head = [_U16.pack(len(tensors))]
    buffers: list[bytes | memoryview] = []
    body = 0
    for name, value in tensors.items():
        array = np.asarray(value)
        dtype, raw, nbytes = _raw(array)
        encoded = name.encode()
        head += [
            _U16.pack(len(encoded)),
            encoded,
            _TENSOR_HEAD.pack(_CODE_OF[dtype], array.ndim),
            struct.pack(f"<{array.ndim}Q", *array.shape),
            _TENSOR_TAIL.pack(nbytes),
        ]
        buffers += raw
        body += nbytes
    return head, buffers, body


def _binary(head: list[bytes], tensors: Mapping[str, np.ndarray]) -> Frame:
    listed, buffers, body = _tensors(tensors)
    text = b"".join([*head, *listed])
    return [PREFIX.pack(len(text), body), text, *buffers]


def encode_call(signature: str, tensors: Mapping[str, np.ndarray]) -> Frame:
    """A call of `signature` on `tensors`, with a binary header."""
    name = signature.encode()
    return _binary([_U8.pack(_CALL), _U16.pack(len(name)), name], tensors)


def encode_result(tensors: Mapping[str, np.ndarray]) -> Frame:
    """A call's outputs, with a binary header."""
    return _binary([_U8.pack(_RESULT)], tensors)


def encode_error(kind: str, message: str) -> Frame:
    """A call's error (`kind`: input or model), with a binary header."""
    text = message.encode(errors="replace")[:4096]
    code = _ERROR_KINDS.index(kind)
    return _binary([_U8.pack(_ERROR), _U8.pack(code), _U16.pack(len(text)), text], {})


def send(sock: socket.socket, frame: Frame) -> None:
    views = [memoryview(b).cast("B") for b in frame if len(b)]
    while views:
        sent = sock.sendmsg(views[:512])
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _read(sock: socket.socket, view: memoryview, least: int, deadline: float | None) -> int:
    """Receive into `view` until at least `least` bytes are in; returns how many are."""
    got = 0
    while got < least:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the other end did not answer in time")
            sock.settimeout(remaining)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise Closed("the other end closed the connection")
        got += n
    return got


# What the first receive of a frame asks for: most frames, whole, in one system call.
_FIRST = 64 * 1024


def receive(
    sock: socket.socket,
    *,
    max_header: int = MAX_HEADER,
    max_body: int = MAX_BODY,
    deadline: float | None = None,
) -> tuple[dict[str, Any], memoryview]:
    """The next frame's header (a JSON object) and body; WireError if it breaks the
    format or a limit, Closed if the socket closes first, TimeoutError past `deadline`
    (time.monotonic()). One frame is in flight at a time: bytes past it are an error."""
    first = bytearray(_FIRST)
    got = _read(sock, memoryview(first), PREFIX.size, deadline)
    header_length, body_length = PREFIX.unpack_from(first)
    if header_length > max_header:
        raise WireError(f"a header of {header_length} bytes (at most {max_header})")
    if body_length > max_body:
        raise WireError(f"a body of {body_length} bytes (at most {max_body})")
    total = PREFIX.size + header_length + body_length
    if got > total:
        raise WireError("bytes past the end of the frame")
    if total <= len(first):
        frame = first
    else:
        frame = bytearray(total)
        frame[:got] = memoryview(first)[:got]
    _read(sock, memoryview(frame)[got:total], total - got, deadline)
    view = memoryview(frame)[:total]
    header = parse_header(view[PREFIX.size : PREFIX.size + header_length])
    return header, view[PREFIX.size + header_length :]


def parse_header(raw: memoryview) -> dict[str, Any]:
    """A frame's header as a dict: a JSON object, or a binary header read into the same
    shape ({"op", "signature" | "kind" and "message", "tensors": [...]}); WireError if it
    is neither."""
    if len(raw) and raw[0] in (_CALL, _RESULT, _ERROR):  # no JSON text starts so
        return _binary_header(raw)
    try:
        header = json.loads(raw.tobytes())
    except ValueError as e:
        raise WireError(f"a header that is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise WireError("a header that is not a JSON object")
    return header


def _text(raw: memoryview, offset: int, size: struct.Struct, what: str) -> tuple[str, int]:
    (length,) = size.unpack_from(raw, offset)
    offset += size.size
    if offset + length > len(raw):
        raise WireError(f"a header whose {what} runs past its end")
    try:
        return bytes(raw[offset : offset + length]).decode(), offset + length
    except UnicodeDecodeError as e:
        raise WireError(f"a header whose {what} is not UTF-8") from e


def _binary_header(raw: memoryview) -> dict[str, Any]:
    try:
        op = raw[0]
        offset = 1
        header: dict[str, Any]
        if op == _CALL:
            signature, offset = _text(raw, offset, _U16, "signature")
            header = {"op": "call", "signature": signature}
        elif op == _RESULT:
            header = {"op": "result"}
        elif op == _ERROR:
            (kind,) = _U8.unpack_from(raw, offset)
            if kind >= len(_ERROR_KINDS):
                raise WireError(f"an error of kind {kind}")
            message, offset = _text(raw, offset + 1, _U16, "message")
            header = {"op": "error", "kind": _ERROR_KINDS[kind], "message": message}
        else:  # pragma: no cover - parse_header sends only these ops here
            raise WireError(f"a binary header of op {op}")
        (count,) = _U16.unpack_from(raw, offset)
        offset += _U16.size
        specs = []
        for _ in range(count):
            name, offset = _text(raw, offset, _U16, "tensor name")
            code, ndim = _TENSOR_HEAD.unpack_from(raw, offset)
            offset += _TENSOR_HEAD.size
            if code >= len(_DTYPE_CODES) or ndim > MAX_DIMS:
                raise WireError(f"tensor {name!r}: dtype code {code}, {ndim} dimensions")
            shape = list(struct.unpack_from(f"<{ndim}Q", raw, offset))
            offset += 8 * ndim
            (nbytes,) = _TENSOR_TAIL.unpack_from(raw, offset)
            offset += _TENSOR_TAIL.size
            specs.append(
                {"name": name, "dtype": _DTYPE_CODES[code], "shape": shape, "nbytes": nbytes}
            )
    except struct.error as e:
        raise WireError(f"a binary header cut short ({e})") from e
    if offset != len(raw):
        raise WireError(f"{len(raw) - offset} bytes past the end of a binary header")
    header["tensors"] = specs
    return header


class FrameReader:
    """One frame read from a non-blocking socket as its bytes come (the event loop's side
    of `receive`, with the same limits and checks): `read_from` returns the header and
    body once the frame is whole, None while it is not; Closed, WireError as `receive`."""

    def __init__(self, *, max_header: int = MAX_HEADER, max_body: int = MAX_BODY) -> None:
        self.max_header = max_header
        self.max_body = max_body
        self._frame = bytearray(_FIRST)
        self._got = 0
        self._total = 0  # 0 until the prefix is in

    def read_from(self, sock: socket.socket) -> tuple[dict[str, Any], memoryview] | None:
        while True:
            end = self._total or len(self._frame)
            try:
                n = sock.recv_into(memoryview(self._frame)[self._got : end])
            except (BlockingIOError, InterruptedError):
                return None
            if n == 0:
                raise Closed("the other end closed the connection")
            self._got += n
            if not self._total and self._got >= PREFIX.size:
                self._sized()
            if self._total and self._got == self._total:
                view = memoryview(self._frame)[: self._total]
                header_length, _ = PREFIX.unpack_from(self._frame)
                header = parse_header(view[PREFIX.size : PREFIX.size + header_length])
                return header, view[PREFIX.size + header_length :]

    def _sized(self) -> None:
        header_length, body_length = PREFIX.unpack_from(self._frame)
        if header_length > self.max_header:
            raise WireError(f"a header of {header_length} bytes (at most {self.max_header})")
        if body_length > self.max_body:
            raise WireError(f"a body of {body_length} bytes (at most {self.max_body})")
        total = PREFIX.size + header_length + body_length
        if self._got > total:
            raise WireError("bytes past the end of the frame")
        if total > len(self._frame):
            frame = bytearray(total)
            frame[: self._got] = memoryview(self._frame)[: self._got]
            self._frame = frame
        self._total = total


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise WireError(f"a shape that is not a list of at most {MAX_DIMS} sizes")
    if not all(type(d) is int and 0 <= d < 2**63 for d in value):
        raise WireError("a shape with sizes that are not integers >= 0")
    return tuple(value)


def tensors_of(header: Mapping[str, Any], body: memoryview) -> dict[str, np.ndarray]:
    """The arrays a frame carries, after checking that its header describes its body
    exactly. Numeric arrays are views of `body`, not copies."""
    specs = header.get("tensors")
    if not isinstance(specs, list):
        raise WireError("a header without a list of tensors")
    out: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        if not isinstance(spec, dict):
            raise WireError("a tensor that is not an object")
        name, dtype, nbytes = spec.get("name"), spec.get("dtype"), spec.get("nbytes")
        if not isinstance(name, str) or not name or len(name) > 256 or name in out:
            raise WireError("a tensor without a name of its own")
        if dtype not in DTYPES:
            raise WireError(f"tensor {name!r}: dtype {dtype!r} is not one that crosses")
        shape = _shape(spec.get("shape"))
        if type(nbytes) is not int or nbytes < 0 or offset + nbytes > len(body):
            raise WireError(f"tensor {name!r}: its bytes are not in the body")
        count = 1
        for d in shape:
            count *= d
        region = body[offset : offset + nbytes]
        if dtype == "string":
            out[name] = _strings(name, region, count, shape)
        else:
            item = _WIRE[dtype]
            if count * item.itemsize != nbytes:
                raise WireError(f"tensor {name!r}: {nbytes} bytes for {count} {dtype} values")
            out[name] = np.frombuffer(region, dtype=item, count=count).reshape(shape)
        offset += nbytes
    if offset != len(body):
        raise WireError(f"{len(body) - offset} bytes of the body belong to no tensor")
    return out


def _strings(name: str, region: memoryview, count: int, shape: tuple[int, ...]) -> np.ndarray:
    head = count * _LENGTH.itemsize
    if head > len(region):
        raise WireError(f"tensor {name!r}: too few bytes for {count} string lengths")
    lengths = np.frombuffer(region, dtype=_LENGTH, count=count)
    if int(lengths.sum(dtype=np.uint64)) != len(region) - head:
        raise WireError(f"tensor {name!r}: the string lengths do not add up to its bytes")
    values = np.empty(count, dtype=object)
    start = head
    for i, length in enumerate(lengths.tolist()):
        values[i] = bytes(region[start : start + length])
        start += length
    return values.reshape(shape)
