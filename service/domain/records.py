"""Plain records that cross a process boundary as JSON (a learner's spec file): a checked
reading of their fields, and a credential type that never prints its value.

Plain dataclasses, not pydantic models: every learner's wrapper reads such records before
its command can start, and building pydantic models cost 0.13 s of that start.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, ClassVar, Protocol


class _HasSecret(Protocol):
    def get_secret_value(self) -> str: ...


class Secret:
    """A credential: prints as '**********', only the spec file holds its value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def of(cls, value: str | _HasSecret | None) -> Secret | None:
        if value is None:
            return None
        return cls(value if isinstance(value, str) else value.get_secret_value())

    def get_secret_value(self) -> str:
        return self._value

    @staticmethod
    def reveal(value: Secret | None) -> str | None:
        """The value of an optional credential."""
        return None if value is None else value.get_secret_value()

    def __repr__(self) -> str:
        return "Secret('**********')"

    def __str__(self) -> str:
        return "**********"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class SpecError(ValueError):
    """The spec file is not one this version of the platform writes."""


STR = (str,)
OPT_STR = (str, type(None))


def checked_fields(cls: type[Any], data: Any, where: str) -> dict[str, Any]:
    """`data` as keyword arguments of dataclass `cls`: an object with only its fields, all
    the required ones, each of the type the class declares in its `_TYPES`."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected an object")
    known = {f.name: f for f in fields(cls)}
    if unknown := sorted(set(data) - set(known)):
        raise SpecError(f"{where}: unknown keys {unknown}")
    for name, f in known.items():
        required = f.default is MISSING and f.default_factory is MISSING
        if required and name not in data:
            raise SpecError(f"{where}: {name} is required")
        expected = cls._TYPES.get(name)
        value = data.get(name)
        if name in data and expected is not None and not isinstance(value, expected):
            raise SpecError(f"{where}.{name}: {type(value).__name__} is not allowed here")
    return dict(data)


class OfKind:
    """A configuration whose `kind` must be one of KINDS."""

    NAME: ClassVar[str]
    KINDS: ClassVar[tuple[str, ...]]
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise SpecError(f"{self.NAME}.kind: {self.kind!r} is not one of {list(self.KINDS)}")
