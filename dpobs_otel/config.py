"""start()'s settings: an explicit argument wins, then a DPOBS_* environment variable, then
the default. A launcher can therefore turn dpobs on (or the guard) without code changes.

Who made a mistake decides what a bad value does. An argument in code is the programmer's:
ValueError, one line naming it. A variable in the environment is the launcher's, and the
program must run whatever it says: one line on stderr names the variable, its value and
what dpobs does instead (the default, or running unmeasured), and nothing raises. A
traceback only with DPOBS_DEBUG=1. VARIABLES lists every variable the package reads, for
the settings page (docs_reference.py).
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, fields

log = logging.getLogger("dpobs_otel")
BOOLEANS = "1/0, true/false, yes/no, on/off"
_SAID: set[tuple[int, str]] = set()  # (pid, line): each said once per process


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"is not a boolean ({BOOLEANS})")


def debugging(env=os.environ) -> bool:
    """DPOBS_DEBUG=1: the lines below carry their traceback. Anything not a boolean is off
    (said without say(), which asks this)."""
    text = env.get("DPOBS_DEBUG", "")
    try:
        return _bool(text)
    except ValueError as exc:
        _once(f"dpobs: DPOBS_DEBUG={text!r} {exc}; no tracebacks (the default)", None)
        return False


def say(line: str, exc: BaseException | None = None) -> None:
    """One line on stderr (through the 'dpobs_otel' logger), once per process; the traceback
    of `exc` only with DPOBS_DEBUG=1."""
    _once(line, exc if exc is not None and debugging() else None)


def _once(line: str, exc: BaseException | None) -> None:
    key = (os.getpid(), line)
    if key not in _SAID:
        _SAID.add(key)
        log.warning("%s", line, exc_info=exc)


def environment_switch(var: str, env=os.environ, *, bad_means: bool, instead: str) -> bool:
    """A boolean variable of the environment; a bad value is said and reads as `bad_means`."""
    text = env.get(var, "")
    try:
        return _bool(text)
    except ValueError as exc:
        say(f"dpobs: {var}={text!r} {exc}; {instead}")
        return bad_means


OFF_SWITCHES = ("OTEL_SDK_DISABLED", "DPOBS_DISABLED")


def disabled(env=os.environ) -> bool:
    """The off switch: OTEL_SDK_DISABLED=true or DPOBS_DISABLED=1. Here, importing nothing
    beyond the standard library, so that DPOBS_AUTO's start-up hook reads it first. A
    malformed value turns dpobs off: whoever set it meant to switch something."""
    return any([environment_switch(var, env, bad_means=True,
                                   instead="dpobs stays off (the program runs unmeasured)")
                for var in OFF_SWITCHES])


# Where rank comes from when DPOBS_RANK is unset: torchrun, then srun.
RANK_FALLBACKS = ("RANK", "SLURM_PROCID")


class Unmeasured(ValueError):
    """Settings from the environment that leave nothing sound to do (TLS asked for but
    incomplete, a bind that fails): start() says this one line and measures nothing."""


@dataclass(frozen=True)
class Settings:
    """Each field is start()'s argument and DPOBS_<FIELD>; DOCS says what each does."""
    role: str = "trainer"
    rank: int = 0
    job: str = "dpobs"
    host: str = "127.0.0.1"
    port: int = 0
    sd_dir: str | None = None
    verify_tensor_hash: bool = False
    weights_in_band: bool = False
    advertise_host: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_client_cafile: str | None = None
    reconcile_rows: int = 16384
    row_age: bool = False
    trace: bool = False
    trace_ring: int = 16384
    trace_every: int = 1
    node: str | None = None
    tq_metrics: bool = False

    @classmethod
    def resolve(cls, env=os.environ, **given) -> "Settings":
        return cls.resolve_sourced(env, **given)[0]

    @classmethod
    def resolve_sourced(cls, env=os.environ, **given) -> "tuple[Settings, dict[str, str]]":
        """The settings, and {setting: the variable it was read from}. A bad argument raises
        ValueError; a bad variable is said (say()) and its setting keeps its default."""
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown dpobs setting(s): {', '.join(sorted(unknown))}")
        values, sources = {}, {}
        for f in fields(cls):
            if given.get(f.name) is not None:
                values[f.name] = _argument(f.name, given[f.name])
                continue
            var = variable_of(f.name, env)
            if var is None:
                continue
            try:
                values[f.name] = _checked(f.name, _parse(f.name, env[var]))
                sources[f.name] = var
            except ValueError as exc:
                say(f"dpobs: {var}={env[var]!r} {exc}; using the default {f.default!r}")
        s = cls(**values)
        s._check_tls(sources, env)
        return s, sources

    def validate(self) -> None:
        """The checks resolve() makes, for Settings built directly."""
        for f in fields(self):
            _argument(f.name, getattr(self, f.name))
        self._check_tls({}, {})

    def _check_tls(self, sources: dict[str, str], env) -> None:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            problem = "TLS needs both tls_certfile and tls_keyfile"
        elif self.tls_client_cafile and not self.tls_certfile:
            problem = "tls_client_cafile (mutual TLS) needs tls_certfile and tls_keyfile"
        else:
            return
        named = [f"{sources[n]}={env[sources[n]]!r}" for n in TLS if n in sources]
        if not named:
            raise ValueError(f"dpobs: {problem}")
        raise Unmeasured(f"dpobs: {', '.join(named)}: {problem}; dpobs runs unmeasured "
                         "(no plain http where TLS was asked for)")

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


# What each setting does (the settings page, docs/reference/settings.md, is made of these).
DOCS = {
    "role": "the process's role label (rollout, trainer, ...)",
    "rank": "the process's rank label; unset, RANK (torchrun), then SLURM_PROCID (srun)",
    "job": "the Prometheus job label; unset, OTEL_SERVICE_NAME (the OTel service is the job)",
    "host": "the address /metrics is served on (loopback unless told otherwise)",
    "port": "the port /metrics is served on (0: any free port)",
    "sd_dir": "a directory where a Prometheus file_sd target file announces this process",
    "verify_tensor_hash": "the wire guard: every row's tensors fingerprinted at put and "
                          "checked at get (docs/guard.md)",
    "weights_in_band": "the weight proof's fingerprints ride in the weight stream (every "
                       "receiver runs dpobs) instead of the job's control store "
                       "(docs/guides/weights.md)",
    "advertise_host": "the host written into file_sd when host is a wildcard (default: the "
                      "host name)",
    "tls_certfile": "serve /metrics over TLS with this certificate (needs tls_keyfile)",
    "tls_keyfile": "the TLS certificate's private key (needs tls_certfile)",
    "tls_client_cafile": "mutual TLS: clients must present a certificate this CA signed",
    "reconcile_rows": "rows put between occupancy reconciliations",
    "row_age": "rows carry their write time; reads observe their age (rowage.py)",
    "trace": "spans of ops, steps and waits, served at /trace (docs/guides/timeline.md)",
    "trace_ring": "spans each process keeps (the oldest go first)",
    "trace_every": "trace one step in this many (ops outside steps follow the process's)",
    "node": "the node on spans (default: this host's name)",
    "tq_metrics": "TransferQueue's own Prometheus exporter turned on at transfer_queue.init "
                  "where the user's config leaves `metrics.enabled` unset "
                  "(adapters/transferqueue/store_metrics.py)",
}
TLS = ("tls_certfile", "tls_keyfile", "tls_client_cafile")
# A bad variable's outcome, where it is not "one line, then the default".
_ON_BAD = {
    "host": "cannot be served on: one line, dpobs runs unmeasured",
    "port": "in use: one line, any free port instead",
    "sd_dir": "cannot be written: one line; /metrics is served, no file_sd target (counted "
              "among the internal errors)",
    **dict.fromkeys(TLS, "without its pair, or a file that does not load: one line, dpobs "
                         "runs unmeasured (no plain http where TLS was asked for)"),
}


def on_bad_value(name: str) -> str:
    """What a bad DPOBS_<NAME> does, in words (the settings page)."""
    kind = {bool: f"not a boolean ({BOOLEANS})", int: "not an integer"}.get(_TYPES[name])
    limit = _LIMITS.get(name, (None, ""))[1]
    wrong = " or ".join(w for w in (kind, limit and limit.removeprefix("is ")) if w)
    said = [f"{wrong}: one line, then the default"] if wrong else []
    return "; ".join(said + [_ON_BAD[name]] if name in _ON_BAD else said) or "any value is taken"
# Each setting's Python type, from its annotation ("int", "str | None", ...).
_TYPES = {f.name: {"str": str, "int": int, "bool": bool}[str(f.type).split(" |")[0]]
          for f in fields(Settings)}
# The one-setting checks: (holds, what a value that fails it is).
_LIMITS = {"role": (bool, "is empty"), "job": (bool, "is empty"),
           "rank": (lambda v: v >= 0, "is below 0"),
           "port": (lambda v: 0 <= v <= 65535, "is not a port (0..65535)"),
           "reconcile_rows": (lambda v: v >= 1, "is below 1"),
           "trace_ring": (lambda v: v >= 1, "is below 1"),
           "trace_every": (lambda v: v >= 1, "is below 1")}


def variable_of(name: str, env=os.environ) -> str | None:
    """The variable setting `name` is read from in `env`, or None: DPOBS_<NAME>, else job's
    OTEL_SERVICE_NAME (the OTel service is the Prometheus job), else rank's RANK_FALLBACKS."""
    fallbacks = {"job": ("OTEL_SERVICE_NAME",), "rank": RANK_FALLBACKS}.get(name, ())
    return next((v for v in ("DPOBS_" + name.upper(), *fallbacks) if v in env), None)


def _checked(name: str, value):
    holds, problem = _LIMITS.get(name, (None, ""))
    if holds is not None and not holds(value):
        raise ValueError(problem)
    return value


def _argument(name: str, value):
    """An argument given in code: its type and limits, or ValueError naming it."""
    want = _TYPES[name]
    if value is not None and not (isinstance(value, want)
                                  and not (want is int and isinstance(value, bool))):
        raise ValueError(f"dpobs: {name}={value!r} is not a {want.__name__}")
    try:
        return value if value is None else _checked(name, value)
    except ValueError as exc:
        raise ValueError(f"dpobs: {name}={value!r} {exc}") from None


def _parse(name: str, raw: str):
    if _TYPES[name] is bool:
        return _bool(raw)
    if _TYPES[name] is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError("is not an integer") from None
    return raw
