"""service.scoring.batch_sizes: merged batches grow to max_batch_size only while the
model's larger calls cost no more per row than its small ones; the LoopBatcher asks it
for every batch and tells it what every call cost."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.scoring.batch_sizes import PROBE_EVERY, WARM, BatchSizes
from tests.unit.test_scoring_loop import LoopModel, batcher, rows, settle

READY, MAX = 64, 256


def primed(small_ms_per_row: float, large_ms_per_row: float) -> BatchSizes:
    sizes = BatchSizes(READY, MAX)
    for _ in range(WARM):
        sizes.record(64, 64 * small_ms_per_row / 1000)
        sizes.record(256, 256 * large_ms_per_row / 1000)
    return sizes


@pytest.mark.parametrize(
    ("small", "large", "pays"),
    [
        (0.0073, 0.0023, True),  # a tiny model: a call's cost is mostly fixed
        (0.26, 0.27, True),  # within the tolerance: noise, not a loss
        (0.26, 0.41, False),  # activations past the caches: 1.6x per row
    ],
)
def test_merges_pay_where_large_calls_cost_no_more_per_row(
    small: float, large: float, pays: bool
) -> None:
    sizes = primed(small, large)
    assert sizes.merges_pay() is pays
    limits = [sizes.limit() for _ in range(PROBE_EVERY)]
    chosen, other = (MAX, READY) if pays else (READY, MAX)
    # Every batch takes the chosen limit, but one in PROBE_EVERY, which measures the other.
    assert limits.count(other) == 1 and limits.count(chosen) == PROBE_EVERY - 1


def test_until_both_kinds_are_known_batches_alternate() -> None:
    sizes = BatchSizes(READY, MAX)
    assert sizes.merges_pay() is None
    assert [sizes.limit() for _ in range(4)] == [MAX, READY, MAX, READY]
    for _ in range(WARM):
        sizes.record(64, 0.001)
    assert sizes.merges_pay() is None  # large calls still unmeasured


def test_a_change_in_what_large_calls_cost_is_followed() -> None:
    sizes = primed(0.26, 0.41)
    assert sizes.merges_pay() is False
    for _ in range(40):  # the probes' large calls have become cheap
        sizes.record(256, 256 * 0.1 / 1000)
    assert sizes.merges_pay() is True


def test_nothing_to_choose_where_ready_rows_is_the_maximum() -> None:
    sizes = BatchSizes(64, 32)
    assert [sizes.limit() for _ in range(3)] == [32, 32, 32]


def test_calls_and_answers_are_ignored_when_they_cannot_be_costs() -> None:
    sizes = BatchSizes(READY, MAX)
    sizes.record(0, 0.1)
    sizes.record(64, -1.0)
    assert sizes.merges_pay() is None


class Recording(BatchSizes):
    def __init__(self, pays: bool) -> None:
        super().__init__(4, 12)
        self.pays = pays
        self.recorded: list[int] = []

    def record(self, rows: int, seconds: float) -> None:
        assert seconds >= 0
        self.recorded.append(rows)

    def merges_pay(self) -> bool | None:
        return self.pays


@pytest.mark.parametrize("pays", [True, False])
def test_the_loop_batcher_merges_only_as_far_as_its_sizes_say(pays: bool) -> None:
    async def main() -> None:
        model = LoopModel(connections=1)
        sizes = Recording(pays)
        b = batcher(model, max_batch_size=12, ready_rows=4, sizes=sizes)
        first = b.submit(rows(0, 4), 4)
        await settle()
        queued = [b.submit(rows(10 * i, 4), 4) for i in range(1, 4)]
        await settle()
        model.answer(0)  # the three queued behind it go now, merged or one by one
        await settle()
        answered = 1
        while answered < len(model.calls):  # each call answered as it comes
            model.answer(answered)
            answered += 1
            await settle()
        await asyncio.gather(first, *queued)  # type: ignore[call-overload]
        for i, f in enumerate(queued, start=1):
            np.testing.assert_array_equal(f.result()["y"], rows(10 * i, 4)["x"] * 2)
        calls = [r for r, _ in model.calls]
        assert calls == ([4, 12] if pays else [4, 4, 4, 4])
        assert sizes.recorded == calls  # every call's rows, with what it took

    asyncio.run(main())
