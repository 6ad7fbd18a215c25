"""What the real-cluster suite runs: each numbered example manifest (manifests/0*.yaml)
with the code its header names (`# Example code: examples/NAME`), and the catalog that lets
them schedule on a cluster without GPUs (kind)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"

_EXAMPLE_CODE = re.compile(r"^#\s*Example code:\s*(examples/[A-Za-z0-9_.-]+)", re.MULTILINE)


@dataclass(frozen=True)
class Example:
    manifest: Path
    code: Path

    @property
    def name(self) -> str:
        return self.manifest.stem


def example_code(manifest_text: str) -> str | None:
    """The example directory a manifest's header names, relative to the repository."""
    found = _EXAMPLE_CODE.search(manifest_text)
    return found.group(1) if found else None


def numbered_examples(directory: Path = MANIFESTS) -> list[Example]:
    """Every numbered manifest with its code directory; ValueError for one whose header
    names none (a new example must say what it runs)."""
    examples = []
    for manifest in sorted(directory.glob("0*.yaml")):
        code = example_code(manifest.read_text())
        if code is None:
            raise ValueError(f"{manifest.name}: no '# Example code: examples/NAME' header")
        examples.append(Example(manifest, ROOT / code))
    return examples


def cpu_catalog(cpus: int = 1, memory_gib: int = 2) -> dict[str, Any]:
    """The compute configurations the examples name, without GPUs, node labels or
    tolerations: a catalog override (DLAAS_CATALOG_FILE) for a cluster of CPU nodes."""
    node = {"gpus": 0, "cpus": cpus, "memory_gib": memory_gib}
    return {
        "compute_configurations": {
            "K80": node,
            "P100": {**node, "supports_distributed": True},
        }
    }
