"""What every op of the instrumented client ends in: its count and duration recorded, its
failure counted, and the guards around dpobs's own components on the op's way (the
critical path, tracing, row age, occupancy, the reconciliation, the histogram's fast path),
so that a component that raises is counted under its own name (names.COMPONENT_*) and never
reaches the user's call. Mixed into InstrumentedClient (its _tel, _stats, _records, _occ,
_cp, _tracer)."""
from __future__ import annotations

from time import perf_counter

from . import names

# What a critical-path start that failed hands its end: nothing was begun, nothing to end.
_UNCOUNTED = object()


class Recording:
    def record_op(self, op, dt, keys, read=0, write=0, missing=0, occupy=None, overhead=0.0,
              t_end=0.0):
        """Count one call of `op` (the measurement every op path ends in; adapters that
        measure calls outside the protocol use it too)."""
        try:
            self._records[op](dt)
        except Exception as exc:
            self._unbound_record(op, dt, exc)
        st = self._stats
        occupancy_failed = None
        with st.lock:
            s = st.ops.get(op) or st.op(op)  # the lookup inlined: it runs on every op
            s.calls += 1
            s.seconds += dt
            s.keys += keys
            s.read_bytes += read
            s.write_bytes += write
            s.missing += missing
            if dt > s.window_max:
                s.window_max = dt
            if occupy is not None:
                try:
                    self._occ.add(*occupy)
                except Exception as exc:  # counted once the lock is released
                    occupancy_failed = exc
            # Our own time: everything after the inner call returned (the lock block itself,
            # a fraction of a microsecond, is the part not counted).
            t = st.instr_seconds
            t["client"] = t.get("client", 0.0) + overhead + (perf_counter() - t_end)
        if occupancy_failed is not None:
            self._tel.internal_error(names.COMPONENT_OCCUPANCY, occupancy_failed)

    def _unbound_record(self, op, dt, exc) -> None:
        """The duration's fast path (shims/otel_histogram.py) raised: counted, and the SDK's own record
        takes the value, so the op's histogram still holds it."""
        self._tel.internal_error(names.COMPONENT_HISTOGRAM, exc)
        try:
            self._tel.op_duration.record(dt, {"op": op})
        except Exception:  # the SDK itself failing: already counted above
            pass

    def record_error(self, op: str, error_type: str) -> None:
        """One more failed `op` whose call record_op already counted (a store that reports
        failure by return code, not exception)."""
        st = self._stats
        with st.lock:
            st.op(op).errors += 1
            key = (op, error_type)
            st.errors[key] = st.errors.get(key, 0) + 1

    def release(self, partition_id: str, ids) -> None:
        """Occupancy: `ids` of a partition (None: all of it) are no longer outstanding."""
        with self._stats.lock:
            self._occ.release(partition_id, ids)

    def live_keys(self, partition_id: str) -> set:
        """A copy of the keys this client holds outstanding in a partition."""
        with self._stats.lock:
            return set(self._occ.live(partition_id))

    def failed_call(self, op, exc, t1, step) -> None:
        """A synchronous call raised: its interval ends now; counted by exception class."""
        t2 = perf_counter()
        self._cp_end(step, t1, t2)
        self.record_failure(op, exc, t2 - t1)

    def record_failure(self, op, exc, dt):
        try:
            try:
                self._records[op](dt)
            except Exception as internal:
                self._unbound_record(op, dt, internal)
            key = (op, type(exc).__name__)
            st = self._stats
            with st.lock:
                s = st.op(op)
                s.calls += 1
                s.seconds += dt
                s.errors += 1
                if dt > s.window_max:
                    s.window_max = dt
                st.errors[key] = st.errors.get(key, 0) + 1
            if self._tracer is not None:
                self._safely(names.COMPONENT_TRACE, self._tracer.failed, op, dt, key[1])
        except Exception as internal:
            self._tel.internal_error(names.COMPONENT_CLIENT, internal)

    # -- components on an op's way: each failure counted under its own name -------------
    def _safely(self, component, fn, *args, fallback=None, on_fail=None):
        """fn(*args); if dpobs's own `fn` raises: counted (component), and `fallback`
        returned (or on_fail(args[1]): the store's result, cleaned)."""
        try:
            return fn(*args)
        except Exception as exc:
            self._tel.internal_error(component, exc)
            return fallback if on_fail is None else on_fail(args[1])

    def _cp_start(self):
        """The critical path's start: (step, t1); a failure leaves the op uncounted there."""
        try:
            return self._cp.start()
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)
            return _UNCOUNTED, perf_counter()

    def _cp_end(self, step, t1, t2) -> None:
        if step is _UNCOUNTED:
            return
        try:  # inlined rather than through _safely: every op ends here
            self._cp.end(step, t1, t2)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)
