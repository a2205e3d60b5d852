"""At most one event per key every `every_s`, and the first one of each key always.

Why a module of its own: a throttle written as `now - last.get(key, 0.0) < every_s` compares a
monotonic clock with a made-up start of 0.0. `time.monotonic()` counts from an arbitrary point
(on Linux: the boot), so on a machine up for less than `every_s` (a fresh CI runner, a node just
booted) that first event, the one that says a transfer started, was suppressed. Here "never
shown" is its own state (no entry), never a time, so the promise holds whatever the clock reads:
the first event of every key is shown (docs/architecture.md, "The node protocol").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable


class Throttle:
    """`due(key)`: whether an event of `key` may be shown now (and, if so, counted as shown).

    The clock is injectable so a test can start it near zero, as on a freshly booted machine.
    """

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._shown: dict[Hashable, float] = {}  # key -> when its last event was shown
        self._lock = threading.Lock()

    def due(self, key: Hashable = None, *, force: bool = False) -> bool:
        """True for the first event of `key`, for a `force`d one (the last of a transfer), and
        once `every_s` has passed since the last one shown; every True is counted as shown."""
        now = self.clock()
        with self._lock:
            last = self._shown.get(key)
            if not force and last is not None and now - last < self.every_s:
                return False
            self._shown[key] = now
            return True
