"""How large a merged batch may grow, from what the model's calls have cost (pure).

Merging the requests queued behind a running call into one call pays when a call's cost
is mostly fixed (a small model: a call of 256 rows costs about what one of 64 costs). It
loses where a call's cost per row grows with its size: a model whose layers' activations
for 256 rows no longer fit the CPU's caches took 1.6 times as long per row in calls of
128-256 rows as in calls of 64 on one VM, so four merged batch-64 requests were answered
at 0.52-0.65 of the rate the model reaches one request at a time.

A call's cost is its share of the model's time: its wall time, divided among the calls
running at once (the caller measures it: `loop_batching.LoopBatcher`). Wall time alone counts
the model's time twice where two calls of `ready_rows` rows run side by side on the two
connections, and makes them look twice as dear per row as a large merged call that has
the cores to itself.

`BatchSizes` keeps, per model, the mean cost per row of its calls of at most `ready_rows`
rows ("small") and of larger ones ("large"), and says how many rows the next merged batch
may hold: `max_batch_size` while large calls cost no more per row than small ones (within
TOLERANCE), `ready_rows` when they cost more. Until both are known, batches alternate
between the two limits; once they are, one batch in PROBE_EVERY takes the other limit, so
that a change (another load on the machine, other request sizes) is seen. A request
larger than the limit is never split: it is a call of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

# Large calls may cost this much more per row than small ones before merges stop at
# ready_rows: what the measurement's noise moves them by.
TOLERANCE = 1.1
# The weight of a call's cost in its kind's mean (the last dozen calls or so count).
WEIGHT = 0.125
# Calls of each kind measured before the means are compared.
WARM = 4
# Once they are, one batch in this many takes the limit not chosen, to measure it again.
# A probe costs: where merges lose, a large call took six small ones' time (the wide model
# above), so one in 32 took a tenth of the model's time; one in 256, 2%.
PROBE_EVERY = 256


@dataclass
class _Mean:
    """An exponentially weighted mean."""

    value: float = 0.0
    count: int = 0

    def add(self, x: float) -> None:
        self.value = x if self.count == 0 else self.value + WEIGHT * (x - self.value)
        self.count += 1


class BatchSizes:
    def __init__(self, ready_rows: int, max_batch_size: int) -> None:
        self.ready_rows = min(ready_rows, max_batch_size)
        self.max_batch_size = max_batch_size
        self._small = _Mean()
        self._large = _Mean()
        self._batches = 0

    def record(self, rows: int, seconds: float) -> None:
        """A call of `rows` rows took `seconds` of the model's time (its share)."""
        if rows <= 0 or seconds < 0:
            return
        (self._small if rows <= self.ready_rows else self._large).add(seconds / rows)

    def merges_pay(self) -> bool | None:
        """Whether large calls cost no more per row than small ones (None: not known yet)."""
        if self._small.count < WARM or self._large.count < WARM:
            return None
        return self._large.value <= self._small.value * TOLERANCE

    def limit(self) -> int:
        """The most rows the next merged batch may hold (asked once per batch)."""
        self._batches += 1
        if self.ready_rows >= self.max_batch_size:
            return self.max_batch_size
        pays = self.merges_pay()
        if pays is None:
            probe = self._batches % 2 == 0
            pays = True
        else:
            probe = self._batches % PROBE_EVERY == 0
        return self.max_batch_size if pays != probe else self.ready_rows
