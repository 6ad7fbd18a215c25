"""Resources as other systems write them, and the compute configuration that holds them.

Pure. FfDL's manifests give `memory` with a unit (`1Gb`, `1GiB`, `512MiB`, `100MB`),
Kubernetes' `resources.limits` give quantities (`1Gi`, `500M`, `1e9`, `2048` bytes,
`500m` CPUs); both become bytes and CPUs here, and `smallest_compute` names the catalog's
compute configuration a job of that size runs on, since the platform's manifest names a
configuration, not resources.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from service.domain.catalog import Catalog, ComputeSpec

# Binary (IEC) and decimal (SI) multipliers. FfDL writes its units in any case ("1Gb",
# "1GB", "512MiB", "512mib"); Kubernetes writes them exactly ("Gi", "G", "k", "m").
_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}

_NUMBER = r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# FfDL's forms: a unit of MB, MiB, GB or GiB in any case (TB and TiB as well, and K for
# completeness), the "B" optional; "1Gb" is FfDL's own example.
_FFDL = re.compile(_NUMBER + r"\s*(?P<prefix>[kmgtp])(?P<binary>i?)b", re.IGNORECASE)
# Kubernetes' quantities: a binary suffix Ki..Ei, a decimal one k, M..E or m (milli), or a
# decimal exponent (1e9), or none (bytes).
_KUBERNETES = re.compile(
    r"(?P<sign>[+-]?)" + _NUMBER + r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)"
    r"|[eE](?P<exponent>[+-]?[0-9]+))?"
)

MEMORY_RULE = (
    "memory is a number of bytes with a unit: FfDL's MB, MiB, GB or GiB (e.g. 1Gb, 512MiB) "
    "or a Kubernetes quantity (e.g. 1Gi, 500M, 1e9, or a plain number of bytes)"
)
CPUS_RULE = "cpus is a number of CPUs (e.g. 2, 0.5) or a Kubernetes quantity in millicores (500m)"


def parse_memory(text: str | int | float) -> int:
    """Bytes of `text`, rounded up to a whole byte. A plain number is bytes (Kubernetes'
    rule). Raises ValueError naming the rule for anything else (negative, no number, an
    unknown unit)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r}: {MEMORY_RULE}")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"{text!r}: {MEMORY_RULE}")
        return math.ceil(text)
    value = text.strip()
    ffdl = _FFDL.fullmatch(value)
    if ffdl is not None:
        prefix = ffdl["prefix"].lower()
        table = _BINARY if ffdl["binary"] else _DECIMAL
        return _whole(Decimal(ffdl["number"]) * table[prefix], text, MEMORY_RULE)
    quantity = _kubernetes_quantity(value)
    if quantity is None or quantity < 0:
        raise ValueError(f"{text!r}: {MEMORY_RULE}")
    return _whole(quantity, text, MEMORY_RULE)


def parse_cpus(value: str | int | float) -> float:
    """CPUs of `value`: a number (FfDL's `cpus: 2`, `0.5`) or a Kubernetes quantity
    (`500m`, `2`, `1.5`). Raises ValueError naming the rule for a negative value or
    anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: {CPUS_RULE}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r}: {CPUS_RULE}")
        return float(value)
    quantity = _kubernetes_quantity(value.strip())
    if quantity is None or quantity < 0:
        raise ValueError(f"{value!r}: {CPUS_RULE}")
    return float(quantity)


def _kubernetes_quantity(value: str) -> Decimal | None:
    match = _KUBERNETES.fullmatch(value)
    if match is None:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the pattern admits decimals only
        return None
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"]
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > 30:
            return None
        return number * Decimal(10) ** exponent
    if suffix is None:
        return number
    if suffix == "m":
        return number / 1000
    if suffix.endswith("i"):
        return number * _BINARY[suffix[0].lower()]
    return number * _DECIMAL[suffix.lower()]


def _whole(amount: Decimal, text: object, rule: str) -> int:
    if amount > 2**70:
        raise ValueError(f"{text!r}: too large; {rule}")
    return math.ceil(amount)


class NoComputeConfiguration(ValueError):
    """No compute configuration of the catalog holds the resources asked for. `resources`
    names what none holds: one of "gpus", "cpus", "memory", "nodes" when no configuration
    holds that alone, all those asked for when none holds them together."""

    def __init__(self, resources: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.resources = resources
        self.message = message


def smallest_compute(
    catalog: Catalog, *, gpus: int, cpus: float, memory_bytes: int, nodes: int
) -> str:
    """The name of the smallest compute configuration of `catalog` that holds a learner of
    `gpus` GPUs, `cpus` CPUs and `memory_bytes` of memory on `nodes` nodes (more than one
    needs a configuration that supports distributed training). Smallest: fewest GPUs, then
    CPUs, then memory, the name breaking ties. Raises NoComputeConfiguration naming what no
    configuration holds."""
    configurations = catalog.compute_configurations
    checks: dict[str, Callable[[ComputeSpec], bool]] = {
        "gpus": lambda c: c.gpus >= gpus,
        "cpus": lambda c: c.cpus >= cpus,
        "memory": lambda c: c.memory_gib * 2**30 >= memory_bytes,
        "nodes": lambda c: nodes <= 1 or c.supports_distributed,
    }
    fitting = [
        (spec.gpus, spec.cpus, spec.memory_gib, name)
        for name, spec in configurations.items()
        if all(check(spec) for check in checks.values())
    ]
    if fitting:
        return min(fitting)[3]
    asked = f"{gpus} GPU(s), {cpus:g} CPU(s), {_gib(memory_bytes)} of memory" + (
        f" on {nodes} nodes" if nodes > 1 else ""
    )
    offered = "; ".join(
        f"{name}: {spec.gpus} GPU(s), {spec.cpus} CPU(s), {spec.memory_gib} GiB"
        + (", distributed" if spec.supports_distributed else "")
        for name, spec in sorted(configurations.items())
    )
    for resource, check in checks.items():
        if not any(check(spec) for spec in configurations.values()):
            what = {
                "gpus": f"{gpus} GPU(s)",
                "cpus": f"{cpus:g} CPU(s)",
                "memory": f"{_gib(memory_bytes)} of memory",
                "nodes": "distributed training",
            }[resource]
            raise NoComputeConfiguration(
                (resource,),
                f"no compute configuration offers {what} (asked for {asked}; offered: {offered})",
            )
    together = tuple(
        name
        for name, used in (
            ("gpus", gpus > 0),
            ("cpus", cpus > 0),
            ("memory", memory_bytes > 0),
            ("nodes", nodes > 1),
        )
        if used
    )
    raise NoComputeConfiguration(
        together,
        f"no compute configuration holds {asked} together (offered: {offered})",
    )


def _gib(memory_bytes: int) -> str:
    return f"{memory_bytes / 2**30:.3g} GiB"
