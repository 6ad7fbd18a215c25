"""What `dlaas up` says when it cannot start."""

from __future__ import annotations


class EmbeddedError(RuntimeError):
    """`dlaas up` could not start; the message says why."""
