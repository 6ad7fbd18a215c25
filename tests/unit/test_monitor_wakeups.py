"""The monitor's wait between passes (`worker.monitor.wait_for_next_pass`): a burst of
wakeups is one pass, a burst of submissions alone fewer still, a lone wakeup starts one at
once, urgent news is not held behind submissions, a stop ends the wait."""

from __future__ import annotations

import threading
import time

from worker.monitor import wait_for_next_pass


def _passes_during_a_burst(
    spacing: float, burst: float, admission_spacing: float | None = None
) -> tuple[int, float]:
    """Run the monitor's loop (a pass is a counter) while another thread wakes it every
    millisecond for `burst` seconds (with `admission_spacing`: wakeups of submissions
    alone); the passes it made, and how long after the last wakeup the last pass started."""
    wakeup, stop, done = threading.Event(), threading.Event(), threading.Event()
    urgent = threading.Event() if admission_spacing is not None else None
    passes: list[float] = []
    last_wakeup = 0.0

    def loop() -> None:
        admitted = float("-inf")
        while not stop.is_set():
            started = time.monotonic()
            wakeup.clear()
            passes.append(started)
            if urgent is None:
                wait_for_next_pass(started, 60.0, wakeup, stop, spacing)
            elif wait_for_next_pass(
                started, 60.0, wakeup, stop, spacing, urgent, admitted, admission_spacing or 0.0
            ):
                admitted = time.monotonic()

    thread = threading.Thread(target=loop)
    thread.start()
    end = time.monotonic() + burst
    while time.monotonic() < end:
        last_wakeup = time.monotonic()
        wakeup.set()
        time.sleep(0.001)
    done.wait(max(spacing, admission_spacing or 0.0) * 4)  # the pass after the last wakeup
    stop.set()
    thread.join(5)
    return len(passes), passes[-1] - last_wakeup


def test_a_burst_of_wakeups_is_a_pass_per_spacing_not_one_each() -> None:
    passes, last_after_wakeup = _passes_during_a_burst(spacing=0.05, burst=0.5)
    # At most one pass per spacing (and the first): ~11, where one per wakeup was ~500.
    assert 2 <= passes <= 0.5 / 0.05 + 2
    # Nothing is lost: a pass started after the last wakeup.
    assert last_after_wakeup >= 0


def test_a_lone_wakeup_starts_the_pass_at_once_and_a_stop_ends_the_wait() -> None:
    wakeup, stop = threading.Event(), threading.Event()
    started = time.monotonic() - 1.0  # the last pass was long ago
    wakeup.set()
    t = time.monotonic()
    wait_for_next_pass(started, 60.0, wakeup, stop, spacing=0.5)  # spacing long passed
    woken_after = time.monotonic() - t
    wakeup.clear()
    stopper = threading.Timer(0.05, stop.set)
    stopper.start()
    t = time.monotonic()
    wait_for_next_pass(time.monotonic(), 60.0, wakeup, stop)  # neither woken nor due
    stopped_after = time.monotonic() - t
    # Neither waited for the 60 s interval, nor the first for any spacing (bounds far
    # above what either takes, so load cannot fail them).
    assert woken_after < 0.4 and stopped_after < 30
    assert wakeup.is_set() is False and stop.is_set()


def test_a_burst_of_submissions_alone_is_a_pass_per_admission_spacing() -> None:
    passes, last_after_wakeup = _passes_during_a_burst(
        spacing=0.01, burst=1.0, admission_spacing=0.2
    )
    # One pass per 0.2 s (and the first), where the spacing alone allowed ~100.
    assert 2 <= passes <= 1.0 / 0.2 + 2
    assert last_after_wakeup >= 0


def test_urgent_news_is_not_held_behind_submissions_and_a_lone_submission_is_admitted_now() -> None:
    wakeup, stop, urgent = threading.Event(), threading.Event(), threading.Event()
    # A submission right after a pass that submissions woke began, then a learner's
    # status 50 ms later.
    started = time.monotonic()
    wakeup.set()
    threading.Timer(0.05, urgent.set).start()
    only_submissions = wait_for_next_pass(
        started, 60.0, wakeup, stop, 0.0, urgent, admitted=started, admission_spacing=30.0
    )
    urgent_after = time.monotonic() - started
    assert only_submissions is False
    # A submission just after a pass that learners' news woke (a busy platform), the last
    # pass that submissions woke long ago: admitted at once, and said so.
    urgent.clear()
    t = started = time.monotonic()
    only_submissions = wait_for_next_pass(
        started, 60.0, wakeup, stop, 0.0, urgent, admitted=started - 1.0, admission_spacing=0.5
    )
    lone_after = time.monotonic() - t
    assert only_submissions is True
    # Neither waited for the admission spacing (bounds far above what either takes).
    assert urgent_after < 15 and lone_after < 0.4
