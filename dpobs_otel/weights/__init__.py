"""Weight sync (DESIGN.md "Weight sync"): `tel.weights`, one sync of version v measured per
side, and with the guard on proven: the sender's fingerprints (manifest.py) travel beside the
weights, through the job's control store (boards.py, carriage.py), or in the stream when
weights_in_band is set, and each receiver checks every tensor it got.

    stream = tel.weights.sent(named_tensors, version=step)        # the trainer
    for name, t in tel.weights.received(stream, version=step): ...  # each receiver
    with tel.weights.sync(version=step, side="send") as sync:      # or a block
        sync.note(name, t)   # and/or torch.distributed calls on this thread (collectives.py)
        item = sync.manifest()   # in band: send it like a weight (None otherwise)
    tel.weights.settle(timeout)  # wait for the checks still reading the store (tests)
"""
from __future__ import annotations

from .. import instruments, names
from . import manifest, streams
from .manifest import MANIFEST_NAME, Carriage
from .meter import WeightMeter
from .sync import Sync

__all__ = ["Weights", "DisabledWeights", "MANIFEST_NAME"]


def _checked_args(version, side: str) -> int:
    if side not in names.WEIGHT_SIDES:
        raise ValueError(f"side must be one of {names.WEIGHT_SIDES}, got {side!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int (the trainer step), got {version!r}")
    return version


class Weights:
    """tel.weights of a started Telemetry."""

    def __init__(self, tel):
        self._tel = tel
        self.meter = WeightMeter(tel.meter, instruments.exported(tel.internal_error))
        self.prove = tel.guard is not None  # fingerprints only with the guard on
        self.in_band = tel.settings.weights_in_band
        self.carriage = Carriage(self, tel.settings.job) if self.prove else None
        # a transfer engine the user imported before start(): its requests made before the
        # first sync are known too (transfers.py)
        self._install_hooks(torch_distributed=False)

    def sync(self, version: int, side: str) -> Sync:
        """A block: one side of the sync of `version`."""
        s = Sync(self, _checked_args(version, side), side)
        self._install_hooks()
        return s

    def sent(self, stream, version: int):
        return streams.through(self.streamed(_checked_args(version, "send"), "send"), stream)

    def received(self, stream, version: int):
        return streams.through(self.streamed(_checked_args(version, "receive"), "receive"),
                               stream)

    def streamed(self, version: int, side: str) -> Sync:
        """The sync of a stream wrapper: proven even when the stream was empty."""
        s = Sync(self, version, side)
        s.streamed = True
        return s

    def stats(self) -> dict:
        return self.meter.stats.snapshot()

    def settle(self, timeout: float = 60.0) -> bool:
        """Wait until every proof this process posted or is reading in the store is done
        (the checks count then); False if some still wait after `timeout` seconds."""
        return self.carriage is None or self.carriage.settle(timeout)

    # -- called by Sync -------------------------------------------------------------------
    def done(self, sync: Sync, t0: float, t1: float) -> None:
        tel = self._tel
        in_step = tel.critical.owned_step() is not None
        self.meter.add(sync.side, sync.version, t1 - t0, sync.bytes, sync.tensors, in_step,
                       sync.check)
        if tel.tracer is not None:
            tel.tracer.weights(sync.side, sync.version, t0, t1, sync.bytes, sync.tensors)

    def prove_later(self, sync: Sync) -> None:
        """A proven sync that ended with no in-band check: out of band, the sender posts its
        fingerprints and the receiver's check waits for them (carriage.py), neither on
        this thread; in band, a receiver that got no manifest item is left unchecked."""
        if sync.side == "send":
            if not self.in_band:
                self.carriage.post(sync.version, dict(sync.digests))
        elif self.in_band:
            self.carriage.unchecked("no_manifest", len(sync.digests))
        else:
            self.carriage.check(sync.version, sync.digests)

    def checked(self, version: int, check) -> None:
        self.meter.add_check(check)
        manifest.report(version, check)

    def internal_error(self, exc: BaseException) -> None:
        self._tel.internal_error(names.COMPONENT_WEIGHTS, exc)

    def _install_hooks(self, torch_distributed: bool = True) -> None:
        if torch_distributed:
            try:
                from . import collectives
                collectives.install()
            except Exception as exc:  # no torch.distributed here: blocks count note() alone
                self.internal_error(exc)
        try:  # Mooncake's TransferEngine, NIXL: only those the user's code imported
            from . import transfers
            transfers.install(self.internal_error)
        except Exception as exc:
            self.internal_error(exc)


class _NoSync:
    def __enter__(self) -> "_NoSync":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def note(self, name, tensor) -> None:
        pass

    def manifest(self):
        return None


class DisabledWeights:
    """tel.weights with dpobs off: the same surface, doing nothing (streams come back as
    they were given)."""

    def sync(self, version: int, side: str):
        return _NoSync()

    def sent(self, stream, version: int):
        return stream

    def received(self, stream, version: int):
        return stream

    def stats(self) -> dict:
        return {}

    def settle(self, timeout: float = 60.0) -> bool:
        return True
