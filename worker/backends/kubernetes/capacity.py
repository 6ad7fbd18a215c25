"""What fits the cluster now (pure): the nodes' allocatable GPUs, CPU and memory, less what
the pods bound to them request, and a training's learners bin-packed onto the nodes its
compute configuration selects (node labels) and tolerates (taints), first fit decreasing.

A training fits only whole (gang): all of its learners are placed, or none. Each placement
is taken from the free amounts, so trainings admitted earlier in the same pass, and
learners of active trainings not bound to a node yet, count against those after them.

Quantities are numbers here (GPUs, CPU millicores, memory bytes): the cluster's quantity
strings are parsed where the objects are read (cluster_state).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.domain.admission import Candidate
from service.domain.catalog import ComputeSpec, Toleration

# Taint effects that keep a pod off a node the scheduler places it on (PreferNoSchedule
# only prefers).
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, order=True)
class Resources:
    """An amount of GPUs, CPU (millicores) and memory (bytes)."""

    gpus: int = 0
    cpu_milli: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus + other.gpus, self.cpu_milli + other.cpu_milli, self.memory + other.memory
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.gpus - other.gpus, self.cpu_milli - other.cpu_milli, self.memory - other.memory
        )

    def times(self, count: int) -> Resources:
        return Resources(self.gpus * count, self.cpu_milli * count, self.memory * count)

    def holds(self, other: Resources) -> int:
        """How many of `other` this amount holds (a large number where `other` is zero)."""
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory < 0:
            return 0
        n = 1 << 30
        # Most often the GPUs bind first (a full GPU node holds none, told at once).
        if other.gpus > 0 and (n := self.gpus // other.gpus) == 0:
            return 0
        if other.cpu_milli > 0:
            n = min(n, self.cpu_milli // other.cpu_milli)
        if other.memory > 0:
            n = min(n, self.memory // other.memory)
        return n


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    # spec.unschedulable (cordoned): nothing new is placed on it.
    unschedulable: bool = False


@dataclass(frozen=True)
class Shape:
    """One learner of a compute configuration: what its pod requests, the node labels it
    requires and the taints it tolerates."""

    compute: str
    requests: Resources
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()

    @classmethod
    def of(cls, name: str, compute: ComputeSpec, overhead: Resources = Resources()) -> Shape:
        """A learner of configuration `compute` (`name`), its pod's other containers
        requesting `overhead`."""
        own = Resources(compute.gpus, compute.cpus * 1000, compute.memory_gib << 30)
        return cls(name, own + overhead, dict(compute.node_selector), compute.tolerations)


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Whether one of the tolerations tolerates the taint (Kubernetes' rules)."""
    for t in tolerations:
        if t.effect is not None and t.effect != taint.effect:
            continue
        if not t.key and t.operator == "Exists":
            return True
        if t.key != taint.key:
            continue
        if t.operator == "Exists" or t.value == taint.value:
            return True
    return False


def matches(node: Node, shape: Shape) -> bool:
    """Whether the scheduler may place a learner of `shape` on `node`: it carries every
    label the shape selects, tolerates each of its blocking taints, and is not cordoned."""
    if node.unschedulable:
        return False
    if any(node.labels.get(k) != v for k, v in shape.node_selector.items()):
        return False
    return all(tolerates(shape.tolerations, t) for t in node.taints if t.effect in BLOCKING_EFFECTS)


@dataclass(frozen=True)
class Demand:
    """`count` learners of `shape` to place, all or none."""

    key: str
    shape: Shape
    count: int


@dataclass(frozen=True)
class Verdict:
    """What became of one demand: placed now, or not, with how many of its learners fit
    now on their own and could ever fit the empty matching nodes."""

    placed: bool
    needed: int
    fit_now: int
    fit_ever: int

    @property
    def never(self) -> bool:
        return self.needed > self.fit_ever


class NodeIndex:
    """The nodes in first-fit order (by name: a restarted monitor packs the same way), and
    what follows from them alone for each learner shape, computed once: the nodes that
    match it and how many of it they hold when empty. Kept while the nodes do not change."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = sorted(nodes, key=lambda n: n.name)
        self.allocatable = {n.name: n.allocatable for n in self.nodes}
        self._matching: dict[str, list[Node]] = {}
        self._ever: dict[str, int] = {}

    def matching(self, shape: Shape) -> list[Node]:
        found = self._matching.get(shape.compute)
        if found is None:
            found = self._matching[shape.compute] = [n for n in self.nodes if matches(n, shape)]
        return found

    def fit_ever(self, shape: Shape) -> int:
        """How many learners of `shape` the matching nodes hold when empty."""
        ever = self._ever.get(shape.compute)
        if ever is None:
            ever = self._ever[shape.compute] = sum(
                n.allocatable.holds(shape.requests) for n in self.matching(shape)
            )
        return ever


class Packing:
    """The cluster's free amounts per node for one pass, taken from as demands are placed:
    the nodes' allocatable less `used` (what bound pods request), less what this pass took."""

    def __init__(
        self,
        nodes: Sequence[Node] | NodeIndex,
        used: Mapping[str, Resources],
        free: Mapping[str, Resources] | None = None,
        gpu_free: Collection[str] | None = None,
    ) -> None:
        """`free`: the allocatable less `used` per node, where the caller keeps it;
        `gpu_free`: the nodes with a GPU free (at least), where the caller keeps them, so
        that a GPU learner is not weighed against every full node of a large cluster."""
        self.index = nodes if isinstance(nodes, NodeIndex) else NodeIndex(nodes)
        self.used = used
        self.base = free
        self.gpu_free = gpu_free
        self._taken: dict[str, Resources] = {}
        self._candidates: dict[str, list[Node]] = {}

    def _nodes_for(self, shape: Shape) -> list[Node]:
        """The matching nodes that may hold a learner of `shape`, in first-fit order."""
        found = self._candidates.get(shape.compute)
        if found is None:
            found = self.index.matching(shape)
            if shape.requests.gpus > 0 and self.gpu_free is not None:
                found = [n for n in found if n.name in self.gpu_free]
            self._candidates[shape.compute] = found
        return found

    def free_on(self, name: str) -> Resources:
        taken = self._taken.get(name)
        if taken is not None:
            return taken
        if self.base is not None:
            return self.base[name]
        used = self.used.get(name)
        allocatable = self.index.allocatable[name]
        return allocatable if used is None else allocatable - used

    def _take(self, name: str, amount: Resources) -> None:
        self._taken[name] = self.free_on(name) - amount

    def fit_now(self, shape: Shape) -> int:
        """How many learners of `shape` the free amounts hold now."""
        return sum(self.free_on(n.name).holds(shape.requests) for n in self._nodes_for(shape))

    def fit_ever(self, shape: Shape) -> int:
        return self.index.fit_ever(shape)

    def place(self, demand: Demand) -> Verdict:
        """Place the demand's learners first fit (all, taken from the free amounts, or
        none, nothing taken)."""
        left = demand.count
        taken: list[tuple[str, int]] = []
        requests = demand.shape.requests
        for node in self._nodes_for(demand.shape):
            n = min(left, self.free_on(node.name).holds(requests))
            if n > 0:
                taken.append((node.name, n))
                left -= n
                if left == 0:
                    break
        ever = self.fit_ever(demand.shape)
        if left == 0:
            for name, n in taken:
                self._take(name, requests.times(n))
            return Verdict(True, demand.count, demand.count, ever)
        # Every matching node was tried: what was found is what fits now.
        return Verdict(False, demand.count, demand.count - left, ever)

    def reserve(self, demands: Iterable[Demand]) -> None:
        """Take what these demands need (learners admitted but not bound to a node yet),
        the largest learners first (first fit decreasing), each learner on its own: one
        that does not fit now takes nothing (the scheduler holds it, Unschedulable)."""
        learners = sorted(
            (d.shape for d in demands for _ in range(d.count)),
            key=lambda s: s.requests,
            reverse=True,
        )
        for shape in learners:
            for node in self._nodes_for(shape):
                if self.free_on(node.name).holds(shape.requests) > 0:
                    self._take(node.name, shape.requests)
                    break


def waiting_message(compute: str, verdict: Verdict) -> str:
    """The status_message of a training that waits for room: what it needs, what fits now."""
    return f"needs {verdict.needed} × {compute} learners; {verdict.fit_now} fit now"  # noqa: RUF001


def never_message(compute: str, verdict: Verdict) -> str:
    """Why a training can never start on this cluster."""
    return (
        f"capacity: {verdict.needed} learners of compute configuration {compute} can never "
        f"fit this cluster: its nodes that match {compute} hold {verdict.fit_ever} at most"
    )


class ClusterFit:
    """Admission's view of the cluster for one pass (service.domain.admission.Fit): each
    training admitted takes its learners' place from `packing`."""

    def __init__(self, packing: Packing, shapes: Mapping[str, Shape]) -> None:
        self.packing = packing
        self.shapes = shapes

    def take(self, candidate: Candidate) -> str | None:
        shape = self.shapes.get(candidate.compute)
        if shape is None:  # a configuration no longer offered: the launch says so
            return None
        verdict = self.packing.place(Demand(candidate.training_id, shape, candidate.nodes))
        return None if verdict.placed else waiting_message(candidate.compute, verdict)

    def never(self, candidate: Candidate) -> str | None:
        """Why the training can never fit this cluster, or None."""
        shape = self.shapes.get(candidate.compute)
        if shape is None:
            return None
        ever = self.packing.fit_ever(shape)
        if candidate.nodes <= ever:
            return None
        return never_message(candidate.compute, Verdict(False, candidate.nodes, 0, ever))
