"""TensorFlow Serving's model metadata and model status messages for a deployment, and
their JSON as its REST API renders them. No TensorFlow, no gRPC: the messages come from
`tfs_protos`; the gRPC API sends them, the REST paths write them as JSON (protobuf's
JSON mapping with every field printed and proto field names, as TensorFlow Serving's
MessageToJsonString options are: int64 values are strings, `"version": "1"`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.json_format import MessageToDict

from service.domain.deployments import DeploymentState, ScoringTarget
from service.domain.signature import SignatureInfo, TensorInfo
from service.scoring.tensors import TensorCodec
from service.scoring.tfs_protos import ServingMessages

SIGNATURE_DEF = "signature_def"
SIGNATURE_DEF_MAP_URL = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
# ModelVersionStatus.State.AVAILABLE, and error codes' OK.
AVAILABLE = "AVAILABLE"


def _tensor_info(codec: TensorCodec, info: TensorInfo, into: Any) -> None:
    """A signature's input or output as TensorFlow's TensorInfo: the graph's tensor name,
    dtype and shape (-1 for a dimension of any size)."""
    if info.tensor:
        into.name = info.tensor
    into.dtype = codec.data_type(info.dtype)
    if info.shape is None:
        into.tensor_shape.unknown_rank = True
        return
    for size in info.shape:
        into.tensor_shape.dim.add().size = -1 if size is None else size


def signature_def_map(
    messages: ServingMessages, codec: TensorCodec, signatures: Mapping[str, SignatureInfo]
) -> Any:
    """The model's SignatureDefMap: every signature, with its method name."""
    defs = messages.SignatureDefMap()
    for name, signature in sorted(signatures.items()):
        signature_def = defs.signature_def[name]
        signature_def.method_name = signature.method
        for key, info in signature.inputs.items():
            _tensor_info(codec, info, signature_def.inputs[key])
        for key, info in signature.outputs.items():
            _tensor_info(codec, info, signature_def.outputs[key])
    return defs


def metadata_response(
    messages: ServingMessages,
    codec: TensorCodec,
    name: str,
    version: int,
    signatures: Mapping[str, SignatureInfo],
) -> Any:
    """GetModelMetadataResponse: the model spec (name, version) and the packed
    SignatureDefMap under metadata["signature_def"]."""
    response = messages.GetModelMetadataResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    packed = response.metadata[SIGNATURE_DEF]
    packed.type_url = SIGNATURE_DEF_MAP_URL
    packed.value = signature_def_map(messages, codec, signatures).SerializeToString()
    return response


def _json(message: Any) -> Any:
    return MessageToDict(
        message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def metadata_json(
    messages: ServingMessages,
    codec: TensorCodec,
    name: str,
    version: int,
    signatures: Mapping[str, SignatureInfo],
) -> dict[str, Any]:
    """GET /v1/models/{name}/metadata: `{"model_spec": ..., "metadata": {"signature_def":
    <SignatureDefMap>}}`, the map written as a message (no `@type`), as TensorFlow
    Serving writes it."""
    response = metadata_response(messages, codec, name, version, signatures)
    defs = signature_def_map(messages, codec, signatures)
    return {
        "model_spec": _json(response.model_spec),
        "metadata": {SIGNATURE_DEF: _json(defs)},
    }


# A deployment's state as a model version's (ModelVersionStatus.State): loading, served,
# or ended by a failure to load (its status then the error, as TensorFlow Serving reports
# a version that failed to load).
# A deployment's or a version's state (service.domain.versions.VersionState) as TF
# Serving's ModelVersionStatus.State.
_STATES = {
    "DEPLOYING": "LOADING",
    "READY": AVAILABLE,
    "FAILED": "END",
    "UNLOADED": "END",
}
_LOAD_FAILED = "UNKNOWN"
# One version's status: (version, state, error message when it FAILED).
VersionStatus = tuple[int, str, str | None]


def version_statuses(
    target: ScoringTarget,
    state: DeploymentState,
    message: str | None,
    requested: int | None,
) -> list[VersionStatus]:
    """What a model status request reports: the version it asked for (`requested`,
    resolved already), else every version the deployment has, each in its own state (the
    deployment's while it has none recorded)."""
    if not target.versions:
        return [(requested or target.version, str(state), message)]
    failed = message if state == DeploymentState.FAILED else "its model could not be loaded"
    chosen = [requested] if requested is not None else sorted(target.versions)
    return [
        (n, target.versions[n].state, failed if target.versions[n].state == "FAILED" else None)
        for n in chosen
        if n in target.versions
    ]


def status_response(messages: ServingMessages, statuses: list[VersionStatus]) -> Any:
    """GetModelStatusResponse: each version in its state, its status OK, or for a version
    that FAILED the reason (error code UNKNOWN)."""
    response = messages.GetModelStatusResponse()
    version_status = messages.GetModelStatusResponse.DESCRIPTOR.fields_by_name[
        "model_version_status"
    ].message_type
    states = version_status.fields_by_name["state"].enum_type.values_by_name
    codes = (
        version_status.fields_by_name["status"]
        .message_type.fields_by_name["error_code"]
        .enum_type.values_by_name
    )
    for version, state, error in statuses:
        status = response.model_version_status.add()
        status.version = version
        status.state = states[_STATES[state]].number
        status.status.SetInParent()
        if state == "FAILED":
            status.status.error_code = codes[_LOAD_FAILED].number
            status.status.error_message = error or ""
    return response


def status_json(messages: ServingMessages, statuses: list[VersionStatus]) -> dict[str, Any]:
    """GET /v1/models/{name}: `{"model_version_status": [{"version": "1", "state":
    "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}`."""
    result: dict[str, Any] = _json(status_response(messages, statuses))
    return result
