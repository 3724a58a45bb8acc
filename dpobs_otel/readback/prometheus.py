"""The one client of Prometheus's HTTP API (/api/v1): instant and range queries, targets,
alerts, rules and readiness. The cluster view, `dpobs top`, `dpobs compare`, the demo's
report and the loopback stacks of dpobs_otel.testing all read Prometheus through it.

    prom = Prometheus("http://127.0.0.1:9090", timeout=5.0)   # ssl_context= for https
    prom.query('up{job="dpobs"}')    # [{"metric": {...}, "value": 1.0, "ts": 1717...}, ...]

Every failure is a PrometheusError: unreachable, an answer that is not JSON, or an error
reply (Prometheus answers a bad query with HTTP 400 and says why in the body; that reason,
errorType and error, is the message). `executor`: run each request on it (the loopback
harness passes a thread that entered a network namespace, so the caller never joins it).
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Executor
from datetime import datetime


class PrometheusError(RuntimeError):
    """Prometheus unreachable, or it refused the request (the message says which)."""


class Prometheus:
    def __init__(self, url: str, timeout: float = 5.0, ssl_context=None,
                 executor: Executor | None = None):
        self.url = url.rstrip("/")
        self.timeout, self.ssl_context, self.executor = timeout, ssl_context, executor

    def get(self, path: str, **params) -> dict:
        """The JSON body of GET url+path: an error reply's body too (it says why)."""
        full = f"{self.url}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        if self.executor is not None:
            return self.executor.submit(self._fetch, full, path).result()
        return self._fetch(full, path)

    def _fetch(self, full: str, path: str) -> dict:
        try:
            with urllib.request.urlopen(full, timeout=self.timeout,
                                        context=self.ssl_context) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            try:
                return json.load(e)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise PrometheusError(f"{self.url} unreachable: {e}") from None

    def api(self, path: str, **params):
        """The `data` of /api/v1/<path>; PrometheusError unless the status is success."""
        body = self.get(f"/api/v1/{path}", **params)
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body if not isinstance(body, dict) else (
                f"{body.get('errorType')}: {body.get('error')}")
            raise PrometheusError(f"{path} {params}: {err}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query (now, or at the epoch time `at`): one {"metric", "value", "ts"}
        per series, values as floats; a scalar answer is one entry with no labels; a native
        histogram's value is its count, with the histogram under "histogram"."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [_sample({}, data["result"])]
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")
        return [_sample(r["metric"], r["value"]) if "value" in r else _native(r)
                for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> list[dict]:
        """A range query's matrix as Prometheus gives it: [{"metric", "values": [[ts, "v"]]}]."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                        step=str(step))["result"]

    def targets(self, state: str = "active") -> list[dict]:
        return self.api("targets", state=state)["activeTargets"]

    def alerts(self) -> list[dict]:
        """Prometheus's own alerts (pending and firing), not Alertmanager's."""
        return self.api("alerts")["alerts"]

    def rules(self) -> list[dict]:
        return self.api("rules")["groups"]

    def alertmanagers(self) -> list[str]:
        """The base URLs of the Alertmanagers Prometheus sends its alerts to (it lists their
        API endpoints: http://host:9093/api/v2/alerts)."""
        active = self.api("alertmanagers")["activeAlertmanagers"]
        return [re.sub(r"/api/v\d+/alerts$", "", a["url"]) for a in active]

    def ready(self) -> bool:
        """Whether /-/ready answers 200 (a server still starting answers 503 or refuses)."""
        def probe() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=self.timeout,
                                            context=self.ssl_context):
                    return True
            except OSError:  # refused, timed out, or an HTTPError status
                return False
        return probe() if self.executor is None else self.executor.submit(probe).result()


def timestamp(rfc3339: str) -> float | None:
    """A timestamp of the API's answers (RFC 3339, nanoseconds, any zone) as epoch seconds;
    None for the zero time Prometheus gives what never happened (a group not yet evaluated)."""
    m = re.fullmatch(r"(.+T[\d:]+)(\.\d+)?(Z|[+-][\d:]+)", rfc3339)
    if m is None:
        raise PrometheusError(f"not an RFC 3339 timestamp: {rfc3339!r}")
    if m[1].startswith("0001-"):
        return None
    zone = "+00:00" if m[3] == "Z" else m[3]
    return datetime.fromisoformat(m[1] + zone).timestamp() + float(m[2] or 0)


def _sample(metric: dict, value: list) -> dict:
    return {"metric": metric, "value": float(value[1]), "ts": float(value[0])}


def _native(r: dict) -> dict:
    """A native-histogram sample: its observation count as the value, the histogram (count,
    sum, buckets as Prometheus gives them) beside it."""
    ts, h = r["histogram"]
    return {"metric": r["metric"], "value": float(h["count"]), "ts": float(ts), "histogram": h}
