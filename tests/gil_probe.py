"""Whether a call releases the GIL: a heartbeat thread keeps ticking through it."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np


def assert_releases_gil(call: Callable[[], object], duration: float) -> None:
    """Runs ``call`` while a thread appends a timestamp every millisecond. A call holding the
    GIL starves the heartbeat for its whole duration (``duration``: the call's time, measured
    beforehand, long enough to observe)."""
    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        call()
    finally:
        stop.set()
        thread.join()
    assert duration > 0.02, "call too quick to observe"
    assert len(ticks) >= 5
    assert np.diff(ticks).max() < max(0.5 * duration, 0.05)


def assert_releases_gil_on(run: Callable[[Any], object], data: Any, grow: Callable[[Any], Any],
                           too_big: Callable[[Any], bool]) -> None:
    """:func:`assert_releases_gil` for ``run(data)``, data first grown (``grow``, e.g. doubled)
    until the call takes over 0.1 s, however fast it is, or until ``too_big(data)``."""
    while True:
        start = time.perf_counter()
        run(data)
        duration = time.perf_counter() - start
        if duration > 0.1 or too_big(data):
            break
        data = grow(data)
    assert_releases_gil(lambda: run(data), duration)
