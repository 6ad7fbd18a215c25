"""The manifest formats a training may be submitted in, and the one entry point that
reads any of them: the platform's own (with the seed documents' flat keys), FfDL's
(service.domain.ffdl_manifest) and Kubeflow's TFJob and MPIJob files
(service.domain.kubeflow_jobs), translated to the platform's. Pure.

Every format ends as the platform's `Manifest`; what the user sent is kept beside it
(`Submitted.document`, stored as the training's `submitted_manifest`), and every refusal,
whichever check makes it, names the field in the document as sent (`as_written`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.catalog import Catalog
from service.domain.ffdl_manifest import is_ffdl_manifest, translate_ffdl
from service.domain.kubeflow_jobs import is_kubernetes_object, translate_kubeflow_job
from service.domain.manifest import Manifest, as_written, load_manifest, normalize_aliases
from service.errors import FieldError

DLAAS_FORMAT = "dlaas"
FFDL_FORMAT = "ffdl"
KUBEFLOW_FORMAT = "kubeflow"
# Each format in words, for messages.
FORMAT_NAMES = {
    DLAAS_FORMAT: "the platform's manifest format",
    FFDL_FORMAT: "FfDL's manifest format",
    KUBEFLOW_FORMAT: "a Kubeflow TFJob or MPIJob",
}


@dataclass(frozen=True)
class Submitted:
    """A manifest as submitted and as the platform runs it."""

    manifest: Manifest
    format: str
    # The document as sent (parsed).
    document: dict[str, Any]
    # Canonical pointer -> pointer in `document`.
    written_as: Mapping[str, str] = field(default_factory=dict)
    # What a translation chose that the document does not say, in words.
    notes: tuple[str, ...] = ()

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES.get(self.format, self.format)

    def as_written(self, errors: list[FieldError]) -> list[FieldError]:
        """Errors about the platform's manifest, named as the user wrote the document."""
        return as_written(errors, self.written_as)


def manifest_format(data: Mapping[str, Any]) -> str:
    """Which format a parsed manifest is written in."""
    if is_kubernetes_object(data):  # apiVersion or kind, which no manifest has
        return KUBEFLOW_FORMAT
    return FFDL_FORMAT if is_ffdl_manifest(data) else DLAAS_FORMAT


def load_submitted(data: Mapping[str, Any], catalog: Catalog, plan_name: str) -> Submitted:
    """Read a parsed manifest of any format: translate it if it is not the platform's
    own, then check it (`load_manifest`). ValidationFailed names the fields as written."""
    document = dict(data)
    submitted_as = manifest_format(data)
    if submitted_as == KUBEFLOW_FORMAT:
        job = translate_kubeflow_job(data, catalog)
        manifest = load_manifest(job.manifest, catalog, plan_name, written_as=job.written_as)
        return Submitted(manifest, KUBEFLOW_FORMAT, document, job.written_as, job.notes)
    if submitted_as == FFDL_FORMAT:
        translation = translate_ffdl(data, catalog)
        manifest = load_manifest(
            translation.document, catalog, plan_name, written_as=translation.written_as
        )
        return Submitted(
            manifest, FFDL_FORMAT, document, translation.written_as, tuple(translation.notes)
        )
    manifest = load_manifest(data, catalog, plan_name)
    _, aliases = normalize_aliases(data)
    return Submitted(manifest, DLAAS_FORMAT, document, aliases)
