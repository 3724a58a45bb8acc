"""Removals deferred past Mooncake's read lease.

Every read of a key (get, is_exist, get_size) grants it a lease (the master's
`-default_kv_lease_ttl`, 10 s unless set); a remove inside it returns -706 and removes
nothing. Forcing the remove would pull memory out from under a reader still transferring
it, so a cleared key that meets a lease waits here and is removed again once the lease
can have ended: `retry_s` after the attempt (a key read again in between is retried again).
Without this, every row read shortly before its clear would stay in the store for good and
the master's occupancy would climb in a put/read/clear loop.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time

from .store import HAS_LEASE, NOT_FOUND

log = logging.getLogger("dpobs_otel.adapters.mooncake")


class DeferredRemovals:
    """Keys waiting for their lease to end, removed by one daemon thread (started on demand).

    `cancel` drops keys a put writes again, so a late removal never deletes a new row; a
    removal and a cancel never interleave (both hold the lock)."""

    def __init__(self, batch_remove, retry_s: float):
        self._remove = batch_remove
        self.retry_s = float(retry_s)
        self._due: dict[str, float] = {}  # key -> monotonic time of the next attempt
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.removed = 0  # keys removed after waiting
        self.failed = 0  # keys dropped on a code other than the lease or not-found

    def __len__(self) -> int:
        with self._cond:
            return len(self._due)

    def add(self, keys) -> None:
        if not keys:
            return
        when = time.monotonic() + self.retry_s
        with self._cond:
            for k in keys:
                self._due[k] = when
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="dpobs-mooncake-removals")
                self._thread.start()
                # Stopped before the interpreter tears down, not killed inside a store call.
                atexit.register(self.close)
            self._cond.notify()

    def cancel(self, keys) -> None:
        with self._cond:
            if self._due:
                for k in keys:
                    self._due.pop(k, None)

    def run_due(self, now: float | None = None) -> None:
        """One attempt at every key whose time has come (the thread calls this)."""
        with self._cond:
            now = time.monotonic() if now is None else now
            keys = [k for k, t in self._due.items() if t <= now]
            if not keys:
                return
            codes = self._remove(keys)
            later = now + self.retry_s
            for k, c in zip(keys, codes):
                if c == HAS_LEASE:  # read again meanwhile: another lease
                    self._due[k] = later
                    continue
                del self._due[k]
                if c in (0, NOT_FOUND):
                    self.removed += 1
                else:
                    self.failed += 1
                    log.warning("dpobs mooncake: deferred remove of %r returned %d; dropped",
                                k, c)

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (True) or `timeout` passes (False)."""
        end = time.monotonic() + timeout
        while len(self):
            if time.monotonic() >= end:
                return False
            time.sleep(min(0.05, self.retry_s))
        return True

    def close(self) -> None:
        """Stop the thread; keys still waiting stay in the store."""
        atexit.unregister(self.close)
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                wait = min(self._due.values(), default=None)
                timeout = None if wait is None else max(wait - time.monotonic(), 0.0)
                if timeout is None or timeout > 0:
                    self._cond.wait(timeout)
                    continue
            try:
                self.run_due()
            except Exception as exc:  # the store went away: keep the keys, try later
                log.warning("dpobs mooncake: deferred removal failed: %r", exc)
                time.sleep(self.retry_s)
