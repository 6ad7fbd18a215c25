"""The monitor's wait between passes (`worker.monitor.wait_for_next_pass`): a burst of
wakeups is one pass, a lone wakeup starts one at once, a stop ends the wait."""

from __future__ import annotations

import threading
import time

from worker.monitor import wait_for_next_pass


def _passes_during_a_burst(spacing: float, burst: float) -> tuple[int, float]:
    """Run the monitor's loop (a pass is a counter) while another thread wakes it every
    millisecond for `burst` seconds; the passes it made, and how long after the last
    wakeup the last pass started."""
    wakeup, stop, done = threading.Event(), threading.Event(), threading.Event()
    passes: list[float] = []
    last_wakeup = 0.0

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            wakeup.clear()
            passes.append(started)
            wait_for_next_pass(started, 60.0, wakeup, stop, spacing)

    thread = threading.Thread(target=loop)
    thread.start()
    end = time.monotonic() + burst
    while time.monotonic() < end:
        last_wakeup = time.monotonic()
        wakeup.set()
        time.sleep(0.001)
    done.wait(spacing * 4)  # the pass after the last wakeup
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
