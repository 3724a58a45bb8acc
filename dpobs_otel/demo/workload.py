"""The demo's GRPO-shaped workload: a rollout process, N trainers and a driver, in their own OS
processes, moving real bytes through one shared InMemoryDataPlane (store.serve_store).

Each step: the rollout puts a batch (jagged tokens, logprobs and loss mask, dense advantages,
per-row metadata) and a verifier without dpobs adds scores; every trainer reads its shard
twice (a logprob pass, a train pass); the driver lists and clears the step's rows. The
processes run in lockstep on one barrier and measure their own ground truth (time inside the
data-plane calls they make, time inside steps, payload bytes, time blocked on data), which the
parent compares with what the metrics say.

With `prefetch` the rollout puts one step ahead and each trainer reads its next shard on a
thread while it trains, waiting for it inside tel.waiting(): exposed time falls below busy
time. `rollout_ms` / `train_ms` add compute (a sleep) to each rollout and trainer step.

Step 0 is a warm-up: it creates every series, then the parent may wait for Prometheus to
scrape that quiescent state before the measured steps start. Rates then begin at a known
point, so rate ratios can be compared with the truth of the measured steps alone."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_mod
import random
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter

import torch
from tensordict import TensorDict

from . import asynchronous, backends, weightsync
from .batches import (FIELDS_LOGPROB_PASS, FIELDS_TRAIN_PASS, PARTITION, ROLE_OPS, Config,
                      make_rows, pack, sample_ids, truth_nbytes, unpack)
from ..testing.processes import Managed, die_with_parent
from ..weights import DisabledWeights
from .truth import Timed, Truth

BARRIER_TIMEOUT_S = 300  # orphans give up after this; a live parent aborts far sooner


@dataclass
class Sync:
    barrier: object  # every role meets here three times a step
    go: object  # Value: the rollout's decision for the coming step, read after the barrier
    stop: object  # Event: the parent asks for a stop at the next step boundary
    measure: object  # Event: the warm-up has been scraped; measured steps may start
    release: object  # Event: the parent has read the final metrics; endpoints may close
    queue: object = None  # asynchronous.Queue of an --async run
    weights_port: object = None  # Value: the weight group's rendezvous port (demo/gloo.py)


def _process(role, rank, cfg: Config, spec, sync: Sync, out) -> None:
    import dpobs_otel as dpobs

    die_with_parent(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into a clean stop
    signal.signal(signal.SIGTERM, _exit_on_term)  # so `finally` removes the file_sd target
    torch.set_num_threads(1)
    tel = raw = None
    try:
        tel = dpobs.start(role=role, rank=rank, job=cfg.job, sd_dir=cfg.sd_dir, host=cfg.host,
                          advertise_host=cfg.advertise_host, verify_tensor_hash=cfg.verify,
                          row_age=cfg.row_age, trace=cfg.trace or None)
        measured = role != cfg.unmeasured
        raw = backends.connect(spec, tel if measured else None)
        timed = Timed(raw, ROLE_OPS[role])
        client = tel.instrument(timed)
        truth = Truth(timed)
        port = tel.endpoint.rsplit(":", 1)[1]
        out.put(("ready", role, rank, {"endpoint": tel.endpoint, "pid": os.getpid(),
                                       "instance": f"{tel.settings.target_host}:{port}"}))
        worker = _Worker(role, rank, cfg, tel, client if measured else None, raw, truth,
                         sync, out)
        worker.loop()
        out.put(("done", role, rank, truth.take()))
        _wait_parent(sync.release)
    except threading.BrokenBarrierError:
        pass  # another process failed or the parent aborted; it reports why
    except BaseException:
        out.put(("error", role, rank, traceback.format_exc()))
        sync.barrier.abort()
    finally:
        if raw is not None:
            backends.disconnect(spec, raw)
        if tel is not None:
            tel.shutdown()


def _exit_on_term(*_):
    raise SystemExit(143)


def _wait_parent(event) -> None:
    """Wait for the parent's event; exit if the parent is gone."""
    parent = multiprocessing.parent_process()
    while not event.wait(0.5):
        if parent is not None and not parent.is_alive():
            raise SystemExit(1)


def metrics_on(step: int, seed: int = 0) -> bool:
    """Benchmark mode: measured steps pair up (1, 2), (3, 4), ...; one of each pair runs with
    dpobs, the other without, in a seeded random order so neither always goes first."""
    pair = (step - 1) // 2
    return (step % 2 == 1) == (random.Random(seed * 1_000_003 + pair).random() < 0.5)


class _Off:
    """dpobs switched off for a step: no step, codec or weight-sync measurement."""
    weights = DisabledWeights()

    @staticmethod
    def step():
        return contextlib.nullcontext()

    @staticmethod
    def codec(stage):
        return contextlib.nullcontext()

    @staticmethod
    def waiting():
        return contextlib.nullcontext()


class _Worker:
    def __init__(self, role, rank, cfg, tel, client, raw, truth, sync, out):
        self.role, self.rank, self.cfg = role, rank, cfg
        self.raw, self.truth = raw, truth
        self.off = (_Off, truth.timed)  # the benchmark's baseline: the same calls, no dpobs
        # --unmeasured ROLE: that role's every step is the baseline's (no client given).
        self.on = self.off if client is None else (tel, client)
        self.sync, self.out = sync, out
        self.gen = torch.Generator().manual_seed(cfg.seed)
        n, t = cfg.batch_size, cfg.trainers
        self.shard = slice(rank * n // t, (rank + 1) * n // t)
        self.prefetch = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if (
            cfg.prefetch and role == "trainer") else None
        self.next = None  # the prefetched shard's future
        self.refit = weightsync.participant(role, rank, cfg, sync.weights_port)

    def loop(self) -> None:
        if self.cfg.async_k:
            return asynchronous.loop(self, _compute)
        sync, step, t_prev, on = self.sync, 0, 0.0, True
        while True:
            if self.role == "rollout":
                sync.go.value = self._decide(step)
            sync.barrier.wait()
            now = perf_counter()
            if self.role == "rollout" and step >= 2:
                # A step's cycle, barrier to barrier: every role's work for it, the driver's
                # clear included. The warm-up's cycle holds the wait for a scrape: not sent.
                self.out.put(("step", step - 1, now - t_prev, on))
            t_prev = now
            if not sync.go.value:
                return self._finish()
            on = step == 0 or not self.cfg.alternate or metrics_on(step, self.cfg.seed)
            self.dp, self.client = self.on if on else self.off
            t0 = perf_counter()
            with self.dp.step():
                getattr(self, self.role)(step)
            self.truth.step(t0, perf_counter())
            if self.role == "rollout" and self.refit is not None:  # loads between its steps
                self.refit.step(self.dp, self.truth, step)
            if step == 0:
                if self.next is not None:  # the warm-up's truth holds its read-ahead whole
                    self.next.result()
                self.out.put(("warm", self.role, self.rank, self.truth.take()))
            step += 1

    def _finish(self) -> None:
        if self.prefetch is not None:  # the last step's read-ahead, never used
            self.prefetch.shutdown(wait=True)
        if self.refit is not None:
            self.refit.close()

    def _decide(self, step: int) -> bool:
        if step == 0:
            return True
        if step == 1:
            self._wait_measure()
        return not self.sync.stop.is_set() and (self.cfg.duration is not None
                                                or step <= self.cfg.steps)

    def _wait_measure(self) -> None:
        _wait_parent(self.sync.measure)

    def rollout(self, step: int) -> None:
        _compute(self.cfg.rollout_ms)
        ahead = [0, 1] if self.cfg.prefetch and step == 0 else [step + self.cfg.prefetch]
        for s in ahead:
            self._put(s)
        self.sync.barrier.wait()  # the batch is in
        self.sync.barrier.wait()  # the trainers have read it

    def _put(self, step: int) -> None:
        rows = make_rows(step, self.cfg, self.gen)
        with self.dp.codec("pack"):
            batch = pack(rows)
        ids = sample_ids(step, self.cfg.batch_size)
        self.client.put_samples(ids, PARTITION, batch)
        self.truth.moved("put", "write", truth_nbytes(batch))
        # A verifier outside dpobs scores the completions: its write is neither timed nor
        # fingerprinted, so guarded readers count these rows unverified (as they should).
        # With --store-metrics it writes through the rollout's client: the store counts
        # every put, and every client is to be measured (or --unmeasured says which not).
        scores = TensorDict({"scores": rows["scores"]}, batch_size=[len(ids)])
        if self.cfg.store_metrics:
            self.client.put_samples(ids, PARTITION, scores)
            self.truth.moved("put", "write", truth_nbytes(scores))
        else:
            self.raw.put_samples(ids, PARTITION, scores)
        if step == self.cfg.corrupt_at:
            # An uninstrumented writer rewrites one row between the put and the reads.
            bad = TensorDict({"advantages": batch["advantages"][:1] + 1.0}, batch_size=[1])
            self.raw.put_samples(ids[:1], PARTITION, bad)

    def trainer(self, step: int) -> None:
        self.sync.barrier.wait()
        if self.prefetch is None:
            shards = self._read(step)
        else:  # step s's shard was read during step s-1 (step 0's: now, on the thread)
            pending = self.next or self.prefetch.submit(self._read, step)
            with self.truth.waiting(), self.dp.waiting():
                shards = pending.result()
            self.next = self.prefetch.submit(self._read, step + 1)  # the rollout put it
        for td in shards:
            with self.dp.codec("unpack"):
                seqs = unpack(td)
            if "advantages" in seqs:  # a token-level policy-gradient surrogate, for realism
                sum(float(a) * float((lp * m).sum()) for a, lp, m in
                    zip(seqs["advantages"], seqs["logprobs"], seqs["mask"]))
        _compute(self.cfg.train_ms)
        self.sync.barrier.wait()
        if self.refit is not None:  # the refit: part of the step the trainer pays for
            self.refit.step(self.dp, self.truth, step)

    def _read(self, step: int) -> list:
        """This trainer's shard of a step, in its two passes."""
        ids = sample_ids(step, self.cfg.batch_size)[self.shard]
        out = []
        for fields in (FIELDS_LOGPROB_PASS, FIELDS_TRAIN_PASS):
            td = self.client.get_samples(ids, PARTITION, fields)
            self.truth.moved("get", "read", truth_nbytes(td))
            out.append(td)
        return out

    def driver(self, step: int) -> None:
        if step == 0:
            self.client.register_partition(PARTITION)
        self.sync.barrier.wait()
        self.sync.barrier.wait()
        # Only the finished step's rows: with prefetch the next step's are already in.
        finished = set(sample_ids(step, self.cfg.batch_size))
        ids = [i for i in self.client.list_sample_ids(PARTITION) if i in finished]
        self.client.clear_samples(ids, PARTITION)


def _compute(ms: float) -> None:
    """A role's compute for a step (--rollout-ms, --train-ms): the data plane is idle."""
    if ms > 0:
        time.sleep(ms / 1e3)


# -- the parent's side -------------------------------------------------------------------
class WorkloadError(RuntimeError):
    pass


class Workload(Managed):
    """Starts the store and the processes; `warmup()`, then `run()`; `close()` releases them.

        with Workload(cfg) as wl:
            wl.warmup()        # every process has done step 0; scrape it now if you like
            truth = wl.run()   # the measured steps; processes stay up until close()
    """

    def __init__(self, cfg: Config, authkey: bytes | None = None):
        self.cfg = cfg
        self.authkey = authkey or os.urandom(16)
        self.procs: dict[tuple[str, int], multiprocessing.Process] = {}
        self.info: dict[tuple[str, int], dict] = {}
        self.warm: dict[tuple[str, int], dict] = {}
        self.truth: dict[tuple[str, int], dict] = {}
        self._backend = None
        self._closed = False

    def start(self, timeout: float = 180) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._backend = backends.start(self.cfg.backend, self.cfg.latency_s, self.authkey,
                                       initializer=die_with_parent,
                                       store_metrics=self.cfg.store_metrics)
        roles = self.cfg.roles()
        self.sync = Sync(ctx.Barrier(len(roles), timeout=BARRIER_TIMEOUT_S), ctx.Value("b", 0),
                         ctx.Event(), ctx.Event(), ctx.Event(),
                         asynchronous.Queue.make(ctx, self.cfg.trainers, self.cfg.async_k)
                         if self.cfg.async_k else None,
                         ctx.Value("i", 0) if self.cfg.weight_sync else None)
        self._queue = ctx.Queue()
        for role, rank in roles:
            p = ctx.Process(target=_process, name=f"dpobs-{role}-{rank}", daemon=True,
                            args=(role, rank, self.cfg, self._backend.spec, self.sync,
                                  self._queue))
            p.start()
            self.procs[(role, rank)] = p
        self._collect("ready", self.info, timeout)

    def warmup(self, timeout: float = 120) -> dict:
        return self._collect("warm", self.warm, timeout)

    def run(self, on_step=None) -> dict:
        """The measured steps, until cfg.steps, cfg.duration or stop(). Returns each process's
        truth; the processes keep their endpoints up until close(). on_step(step, cycle_s,
        elapsed_s, metrics_on) follows each step."""
        self.sync.measure.set()
        t0 = time.monotonic()
        dur = self.cfg.duration

        def tick(msg):
            if msg[0] == "step" and on_step is not None:
                on_step(msg[1], msg[2], time.monotonic() - t0, msg[3])
            if dur and time.monotonic() - t0 >= dur:
                self.stop()
        return self._collect("done", self.truth, None, tick)

    def stop(self) -> None:
        """Finish the current step, then stop (safe from a signal handler)."""
        self.sync.stop.set()
        self.sync.measure.set()  # a stop during the warm-up must not leave the rollout waiting

    def _collect(self, kind: str, into: dict, timeout: float | None, tick=None) -> dict:
        # Feeder threads may deliver one process's "warm" before another's "ready": file
        # every message by kind, whichever is awaited.
        boxes = {"ready": self.info, "warm": self.warm, "done": self.truth}
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(into) < self._parties():
            try:
                msg = self._queue.get(timeout=0.25)
            except queue_mod.Empty:
                msg = None
            if msg is not None and msg[0] == "error":
                self.sync.barrier.abort()
                raise WorkloadError(f"{msg[1]} {msg[2]} failed:\n{msg[3]}")
            if msg is not None and msg[0] in boxes:
                boxes[msg[0]][(msg[1], msg[2])] = msg[3]
            if tick is not None:
                tick(msg or ("idle",))
            if msg is None:
                dead = [f"{r}{k} (exit {p.exitcode})" for (r, k), p in self.procs.items()
                        if p.exitcode is not None]
                if dead:
                    self.sync.barrier.abort()
                    raise WorkloadError(f"process(es) died while waiting for {kind!r}: "
                                        + ", ".join(dead))
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkloadError(f"timed out waiting for {kind!r} from "
                                        f"{sorted(set(self.procs) - set(into))}")
        return into

    def _parties(self) -> int:
        """How many processes report (ray_plane's driver reports for its actors too)."""
        return len(self.procs)

    def close(self) -> None:
        """Release the processes (their endpoints close), stop the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.procs:
            self.stop()
            self.sync.release.set()
            self.sync.barrier.abort()  # anyone still inside a step leaves it
            for p in self.procs.values():
                p.join(timeout=10)
            for p in self.procs.values():
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            self._queue.close()
            self._queue.join_thread()
        if self._backend is not None:
            self._backend.close()
