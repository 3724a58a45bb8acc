"""Fetch every listed process's /trace in parallel. A process that does not answer (down,
tracing off: 404, a timeout) is named with its reason, never fatal."""
from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def trace_url(address: str, steps: int | None, https: bool) -> str:
    query = f"?steps={steps}" if steps is not None else ""
    return f"{'https' if https else 'http'}://{address}/trace{query}"


def fetch(address: str, steps: int | None = None, timeout: float = 5.0,
          ssl_context=None) -> dict:
    """One process's ring (the JSON tracer.snapshot gives); raises on any failure."""
    req = urllib.request.Request(trace_url(address, steps, ssl_context is not None),
                                 headers={"Accept-Encoding": "gzip"})
    # Straight to the process, as scrape.py does: no HTTP(S)_PROXY in between.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=ssl_context))
    with opener.open(req, timeout=timeout) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("spans"), list):
        raise ValueError("not a dpobs trace")
    return doc


def reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return (f"HTTP {exc.code}: tracing is off there (DPOBS_TRACE=1 turns it on)"
                if exc.code == 404 else f"HTTP {exc.code}")
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    return f"{type(exc).__name__}: {exc}"


def collect(addresses: list[str], steps: int | None = None, timeout: float = 5.0,
            ssl_context=None) -> tuple[list[tuple[str, dict]], dict[str, str]]:
    """([(address, ring)], {address: why it gave none}) for every address, in parallel."""
    got, missing = [], {}
    if not addresses:
        return got, missing
    with ThreadPoolExecutor(min(32, len(addresses)), thread_name_prefix="dpobs-trace") as pool:
        futures = {a: pool.submit(fetch, a, steps, timeout, ssl_context) for a in addresses}
        for address, fut in futures.items():
            try:
                got.append((address, fut.result()))
            except Exception as exc:
                missing[address] = reason(exc)
    return got, missing
