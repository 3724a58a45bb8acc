"""The agent watching its own prometheus's remote-write queues, from the two ends that
binary offers: its log (every failed send, with the receiver's answer in `err`) and its
/metrics (prometheus_remote_storage_queue_highest_sent_timestamp_seconds, which moves only
when the receiver accepted a batch).

Two things come of it. A receiver that refuses native histograms (its answer names them)
ends the native queue: `on_native_refused` is called once, and the command reloads its
prometheus without that queue. A queue that had no batch accepted for `stall_s` while its
sends fail is a total failure the central side cannot alert on (nothing arrives there), so
one error line says so here, naming the receiver's last answer, and again every
`repeat_s` while it lasts.
"""
from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request
from typing import Callable

from .config import NATIVE_QUEUE

_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
# Prometheus 2.x ("native histograms are disabled"), Mimir and Cortex ("native histograms
# ... disabled"), Thanos Receive: every refusal we know names them in these words.
NATIVE_REFUSAL = re.compile(r"native histogram", re.I)
SENT = "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"
_SENT_LINE = re.compile(SENT + r'\{[^}]*remote_name="([^"]+)"[^}]*\} (\S+)')
_FAILED_LINE = re.compile(r'prometheus_remote_storage_(?:samples|histograms)_(?:failed|retried)'
                          r'_total\{[^}]*remote_name="([^"]+)"[^}]*\} (\S+)')


def log_fields(line: str) -> dict[str, str]:
    """A go-kit logfmt line as a dict, quotes and escapes undone."""
    out = {}
    for key, value in _FIELD.findall(line):
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key] = value
    return out


def sent_timestamps(metrics_text: str) -> dict[str, float]:
    """Per queue, the newest sample timestamp its receiver accepted (0: none yet)."""
    return {name: float(v) for name, v in _SENT_LINE.findall(metrics_text)}


def failures(metrics_text: str) -> dict[str, float]:
    """Per queue, samples and histograms failed or retried so far."""
    out: dict[str, float] = {}
    for name, v in _FAILED_LINE.findall(metrics_text):
        out[name] = out.get(name, 0.0) + float(v)
    return out


class Watch:
    def __init__(self, url: str, metrics_url: str, stall_s: float = 60, repeat_s: float = 300,
                 on_native_refused: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, out=None):
        self.url, self.metrics_url = url, metrics_url
        self.stall_s, self.repeat_s = stall_s, repeat_s
        self.on_native_refused = on_native_refused
        self.clock, self.out = clock, out
        self.lock = threading.Lock()
        self.failing_since: dict[str, float] = {}  # queue -> first failure since a success
        self.last_error: dict[str, str] = {}
        self.reported: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        self.fails: dict[str, float] = {}
        self.dropped: set[str] = set()  # queues the config no longer has
        self.reload = threading.Event()  # the supervisor sends prometheus SIGHUP on it

    def line(self, text: str) -> None:
        """One line of prometheus's log (the reader thread calls this)."""
        f = log_fields(text)
        queue, err = f.get("remote_name"), f.get("err")
        msg = f.get("msg", "").lower()
        # a 5xx or no answer: "Failed to send batch, retrying"; a 4xx (the batch dropped):
        # "non-recoverable error"
        if not queue or not err or not ("send" in msg or "non-recoverable" in msg):
            return
        with self.lock:
            if queue in self.dropped:  # its last retries, while the reload stops it
                return
            self.last_error[queue] = err
            self.failing_since.setdefault(queue, self.clock())
            refused = queue == NATIVE_QUEUE and NATIVE_REFUSAL.search(err) is not None
            callback = self.on_native_refused if refused else None
            if refused:
                self.on_native_refused = None  # once
        if callback is not None:
            callback(err)
            self.forget(NATIVE_QUEUE)
            self.reload.set()

    def poll(self) -> None:
        """Read the queues' progress; print the error of a queue stalled too long."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                text = r.read().decode()
            self.accepted(sent_timestamps(text))
            self.failed(failures(text))
        except OSError:  # not listening yet, or restarting: nothing learnt
            pass
        self.report()

    def accepted(self, sent: dict[str, float]) -> None:
        with self.lock:
            for queue, ts in sent.items():
                if ts > self.sent.get(queue, 0):
                    self.failing_since.pop(queue, None)
                    self.reported.pop(queue, None)
                self.sent[queue] = max(ts, self.sent.get(queue, 0))

    def failed(self, counts: dict[str, float]) -> None:
        """Failures counted since the last poll start a stall too: prometheus logs an
        identical error once a minute at most, so a log line alone can miss one."""
        now = self.clock()
        with self.lock:
            for queue, total in counts.items():
                if total > self.fails.get(queue, total) and queue not in self.dropped:
                    self.failing_since.setdefault(queue, now)
                self.fails[queue] = total

    def report(self) -> None:
        now = self.clock()
        with self.lock:
            due = [q for q, since in self.failing_since.items()
                   if now - since >= self.stall_s
                   and now - self.reported.get(q, -1e18) >= self.repeat_s]
            for q in due:
                self.reported[q] = now
            lines = [self.message(q, now - self.failing_since[q]) for q in due]
        for text in lines:
            print(text, file=self.out or sys.stderr, flush=True)

    def message(self, queue: str, for_s: float) -> str:
        return (f"dpobs agent: error: {self.url} has accepted no batch of queue {queue} "
                f"for {for_s:.0f} s; its last answer: {self.last_error.get(queue, '?')}. "
                "The samples wait in the agent's WAL and go when it accepts them.")

    def forget(self, queue: str) -> None:
        """A queue the config no longer has."""
        with self.lock:
            self.dropped.add(queue)
            for d in (self.failing_since, self.last_error, self.reported, self.sent, self.fails):
                d.pop(queue, None)
