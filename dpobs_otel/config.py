"""start()'s settings: an explicit argument wins, then a DPOBS_* environment variable, then
the default. A launcher can therefore turn dpobs on (or the guard) without code changes."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, fields


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parse_bool(text: str, name: str) -> bool:
    try:
        return _bool(text)
    except ValueError as exc:
        raise ValueError(f"{name}={text!r}: {exc}") from None


def disabled(env=os.environ) -> bool:
    """The off switch: OTEL_SDK_DISABLED=true or DPOBS_DISABLED=1. Here, importing nothing
    beyond the standard library, so that DPOBS_AUTO's start-up hook reads it first."""
    return (parse_bool(env.get("OTEL_SDK_DISABLED", ""), "OTEL_SDK_DISABLED")
            or parse_bool(env.get("DPOBS_DISABLED", ""), "DPOBS_DISABLED"))


# Where rank comes from when DPOBS_RANK is unset: torchrun, then srun.
RANK_FALLBACKS = ("RANK", "SLURM_PROCID")


@dataclass(frozen=True)
class Settings:
    role: str = "trainer"
    rank: int = 0
    job: str = "dpobs"
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 0  # 0: any free port
    sd_dir: str | None = None
    verify_tensor_hash: bool = False
    # the weight proof's fingerprints ride in the weight stream (every receiver runs dpobs)
    # instead of the job's control store (weights/boards.py; docs/guides/weights.md)
    weights_in_band: bool = False
    advertise_host: str | None = None  # the host written into file_sd, when host is a wildcard
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_client_cafile: str | None = None  # when set, clients must present a certificate
    reconcile_rows: int = 16384  # rows put between occupancy reconciliations
    row_age: bool = False  # rows carry their write time; reads observe their age (rowage.py)
    trace: bool = False  # spans of ops, steps and waits (tracing/), served at /trace
    trace_ring: int = 16384  # spans each process keeps (the oldest go first)
    trace_every: int = 1  # trace one step in this many (ops outside steps follow the process's)
    node: str | None = None  # the node on spans (default: this host's name)
    # TransferQueue's own Prometheus exporter turned on by dpobs at transfer_queue.init when
    # the user's config leaves `metrics.enabled` unset (adapters/transferqueue/store_metrics.py)
    tq_metrics: bool = False

    @classmethod
    def resolve(cls, env=os.environ, **given) -> "Settings":
        known = {f.name for f in fields(cls)}
        unknown = set(given) - known
        if unknown:
            raise TypeError(f"unknown dpobs setting(s): {', '.join(sorted(unknown))}")
        values = {}
        for f in fields(cls):
            raw = given.get(f.name)
            if raw is None:
                raw = env.get("DPOBS_" + f.name.upper())
                if raw is None and f.name == "job":
                    raw = env.get("OTEL_SERVICE_NAME")  # the OTel service is the Prometheus job
                if raw is None and f.name == "rank":
                    raw = next((env[v] for v in RANK_FALLBACKS if v in env), None)
                if raw is None:
                    continue
                raw = _parse(f.name, f.type, raw)
            values[f.name] = raw
        s = cls(**values)
        s.validate()
        return s

    def validate(self) -> None:
        """Explicit arguments get the checks environment values get."""
        for f in fields(self):
            v = getattr(self, f.name)
            want = _TYPES[f.name]
            if v is not None and not (isinstance(v, want) and not
                                      (want is int and isinstance(v, bool))):
                raise TypeError(f"dpobs setting {f.name} must be {want.__name__}, "
                                f"got {type(v).__name__} {v!r}")
        if not self.role or not self.job:
            raise ValueError("role and job must be non-empty strings")
        if self.rank < 0:
            raise ValueError(f"rank must be >= 0, got {self.rank}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.reconcile_rows < 1:
            raise ValueError(f"reconcile_rows must be >= 1, got {self.reconcile_rows}")
        if self.trace_ring < 1 or self.trace_every < 1:
            raise ValueError(f"trace_ring and trace_every must be >= 1, got "
                             f"{self.trace_ring} and {self.trace_every}")
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("TLS needs both tls_certfile and tls_keyfile")
        if self.tls_client_cafile and not self.tls_certfile:
            raise ValueError("tls_client_cafile (mutual TLS) needs tls_certfile and tls_keyfile")

    @property
    def target_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return self.host

    @property
    def node_name(self) -> str:
        return self.node or socket.gethostname()


# Each setting's Python type, from its annotation ("int", "str | None", ...).
_TYPES = {f.name: {"str": str, "int": int, "bool": bool}[str(f.type).split(" |")[0]]
          for f in fields(Settings)}


def _parse(name: str, typ, raw: str):
    try:
        if "bool" in str(typ):
            return _bool(raw)
        if "int" in str(typ):
            return int(raw)
        return raw
    except ValueError as exc:
        raise ValueError(f"DPOBS_{name.upper()}={raw!r}: {exc}") from None
