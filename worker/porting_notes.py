"""The failure message of a TensorFlow 1.x training whose script needs porting: the
domain's rule (service.domain.porting) applied to the first lines of its log, read from
the log store once, when the monitor records the training FAILED."""

from __future__ import annotations

import logging

from service.db.models import Training
from service.domain.porting import LINES_READ, porting_note, runs_tensorflow1_scripts
from service.logs.base import LogStore, LogStoreUnavailable

log = logging.getLogger(__name__)


def with_porting_note(logs: LogStore, training: Training, message: str) -> str:
    """`message`, with what to port and where the notes are when the training's log shows
    a TensorFlow 1.x import that failed; as it is otherwise, or when the log store cannot
    be read now (the failure is recorded all the same)."""
    if not runs_tensorflow1_scripts(training.framework_version):
        return message
    try:
        records, _ = logs.read(training.id, None, LINES_READ)
    except LogStoreUnavailable as e:
        log.warning("training %s: its log cannot be read for porting notes: %s", training.id, e)
        return message
    note = porting_note(training.framework_version, (r.line for r in records))
    return message if note is None else f"{message}: {note}"
