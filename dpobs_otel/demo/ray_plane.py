"""`dpobs demo --backend ray`: the GRPO workload with Ray's object store as its data plane.

verl's single controller in miniature: the driver (a process of its own, with its own local
Ray on 127.0.0.1 and a small object store) holds each step's prompts, puts them and calls the
rollout actor with the ref; it collects the generated batch with ray.get, puts one shard per
trainer and calls every trainer's compute_log_prob and then update_actor by ref (the log-probs
the first call returned go back by ref too), collecting each with ray.get. Nothing goes by
value, so each call's submission carries no bytes, as in verl.

dpobs measures Ray itself (adapters/ray): the driver instruments it in code, the actors the
zero-code way (DPOBS_AUTO=1 and the job's DPOBS_* variables through runtime_env env_vars;
each actor's role and rank set there). Beside it the driver keeps the truth: its own timer
around every put, remote call and get, per op and method, and Ray's object size of every
object those ops and the workers' side of each call move
(ray.experimental.get_object_locations), read after each step.

RayWorkload speaks Workload's protocol to the parent (ready, warm, step, done messages; the
stop, measure and release events), so `dpobs demo` and `dpobs compare` run it as they run the
other backends. Its warm-up (step 0) runs inside start(): an actor starts dpobs at its first
call, and only then is its endpoint known.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import traceback
from time import perf_counter

import torch

from .. import names as nm
from ..testing.processes import die_with_parent
from ..testing.transferqueue import LOOPBACK_ENV, LOOPBACK_IP
from .batches import Config, make_rows
from .ray_truth import RayTruth, role_truth
from .workload import Sync, Workload, _compute, _exit_on_term, _wait_parent

OBJECT_STORE_BYTES = 128 * 1024**2  # small: a demo's steps hold a few MB at a time
PROMPT_LEN = 256  # int64 prompt tokens per row: 64 rows are above Ray's 100 KiB inline limit
RAY_START_S = 300  # Ray's start, the actors' and the warm-up step's, on a busy machine


class Rollout:
    """The rollout worker group (one actor): generates a GRPO batch from the step's prompts."""

    def __init__(self, cfg: Config):
        torch.set_num_threads(1)
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def generate_sequences(self, prompts: dict) -> dict:
        _compute(self.cfg.rollout_ms)
        return dense(make_rows(prompts["step"], self.cfg, self.gen))


class Trainer:
    """One trainer of the actor worker group: a log-prob pass, then a policy-gradient update."""

    def __init__(self, cfg: Config):
        torch.set_num_threads(1)
        self.cfg = cfg

    def compute_log_prob(self, shard: dict) -> dict:
        return {"old_log_probs": shard["logprobs"] * shard["mask"]}

    def update_actor(self, shard: dict, old: dict) -> dict:
        mask = shard["mask"].float()
        ratio = torch.exp(shard["logprobs"] * mask - old["old_log_probs"])
        loss = -(shard["advantages"][:, None] * ratio * mask).sum() / mask.sum().clamp(min=1)
        _compute(self.cfg.train_ms)
        return {"loss": float(loss), "tokens": int(shard["lengths"].sum())}


GEN = f"{Rollout.__name__}.generate_sequences"
LOGPROB = f"{Trainer.__name__}.compute_log_prob"
UPDATE = f"{Trainer.__name__}.update_actor"


def dense(rows: dict) -> dict:
    """A batch as verl's DataProto holds one: jagged rows right-padded to the longest."""
    pad = torch.nn.utils.rnn.pad_sequence
    return {"tokens": pad(rows["tokens"], batch_first=True),
            "logprobs": pad(rows["logprobs"], batch_first=True),
            "mask": pad(rows["mask"], batch_first=True),
            "lengths": torch.tensor([len(t) for t in rows["tokens"]]),
            "advantages": rows["advantages"], "scores": rows["scores"], "meta": rows["meta"]}


def shards(batch: dict, n: int) -> list[dict]:
    """The batch split by rows into n shards, each its own copy (a view would carry the whole
    batch's storage into the object store)."""
    rows = len(batch["lengths"])
    out = []
    for r in range(n):
        sl = slice(r * rows // n, (r + 1) * rows // n)
        out.append({k: v[sl].clone() if torch.is_tensor(v) else v[sl] for k, v in batch.items()})
    return out


def actor_env(settings, role: str, rank: int) -> dict:
    """What an actor's runtime_env hands it: dpobs on, the job's settings, its role and rank,
    Ray's loopback switches."""
    env = {"DPOBS_AUTO": "1", "DPOBS_JOB": settings.job, "DPOBS_ROLE": role,
           "DPOBS_RANK": str(rank), "DPOBS_HOST": settings.host,
           "DPOBS_TRACE": "1" if settings.trace else "0", "OMP_NUM_THREADS": "1",
           **LOOPBACK_ENV}
    for key, value in (("SD_DIR", settings.sd_dir), ("ADVERTISE_HOST", settings.advertise_host)):
        if value:
            env[f"DPOBS_{key}"] = value
    return env


class _Driver:
    def __init__(self, cfg: Config, tel, sync: Sync, out):
        import ray
        self.ray, self.cfg, self.tel, self.sync, self.out = ray, cfg, tel, sync, out
        self.here = ray.get_runtime_context().get_node_id()
        self.truth = RayTruth(self.here)
        self.truth.ray = ray
        # Actors go to the other nodes first, round robin: with --nodes 2 the rollout and
        # trainer 0 sit away from the driver, trainer 1 beside it.
        others = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != self.here)
        self.placement = [*others, self.here]
        self.where: dict[tuple[str, int], str] = {}
        self.steps, self.step_s = 0, 0.0
        # The config goes to the actors by ref too: its size is then Ray's to report.
        self.cfg_ref = self.truth.call(nm.RAY_PUT, "", ray.put, cfg)
        self.truth.moved((nm.RAY_PUT, "", "driver", 0), [self.cfg_ref])
        self.rollout = self._actor(Rollout, "rollout", 0, 0)
        self.trainers = [self._actor(Trainer, "trainer", r, r + 1) for r in range(cfg.trainers)]
        self._ready()
        self.held: list = []  # the last step's refs: what the driver owns between steps

    def _actor(self, cls, role: str, rank: int, seat: int):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        node = self.where[(role, rank)] = self.placement[seat % len(self.placement)]
        env = actor_env(self.tel.settings, role, rank)
        # An actor's creation is not a measured call on the driver; its worker's side is.
        self.truth.moved((nm.RAY_ARGS, f"{cls.__name__}.__init__", role, rank), [self.cfg_ref],
                         to=node)
        return self.ray.remote(cls).options(
            runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(self.cfg_ref)

    def _ready(self) -> None:
        """Every actor started before the first step, so no call or get carries a worker's
        start-up (Ray's __ray_ready__ is not measured; the get of its refs is, as any get)."""
        refs = [a.__ray_ready__.remote() for a in (self.rollout, *self.trainers)]
        self._get("", refs)

    def _get(self, method: str, refs: list):
        """The driver collects refs as verl's does, after a ray.wait that lets them exist
        without fetching them (fetch_local=False): the get's own time is then all moving data,
        which is what the truth's timer around it measures (DESIGN.md: a get's data time
        starts when its last object exists)."""
        t, drv = self.truth, ("driver", 0)
        t.call(nm.RAY_WAIT, "", self.ray.wait, refs, num_returns=len(refs), fetch_local=False)
        t.counted((nm.RAY_WAIT, "", *drv), refs)
        t.moved((nm.RAY_GET, method, *drv), refs, to=self.here)
        return t.call(nm.RAY_GET, method, self.ray.get, refs)

    def loop(self) -> None:
        step = 0
        while True:
            if step == 1:
                _wait_parent(self.sync.measure)
            if step >= 1 and (self.sync.stop.is_set() or (
                    self.cfg.duration is None and step > self.cfg.steps)):
                break
            t0 = perf_counter()
            with self.tel.step():
                self.step(step)
            dt = perf_counter() - t0
            self.steps, self.step_s = self.steps + 1, self.step_s + dt
            self.truth.size(self.ray)
            if step == 0:
                self._announce()
                self._send("warm")
            else:
                self.out.put(("step", step, dt, True))
            step += 1
        self._send("done")

    def step(self, step: int) -> None:
        ray, t, n = self.ray, self.truth, len(self.trainers)
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        prompts = {"step": step, "prompts": torch.randint(
            0, 32000, (self.cfg.batch_size, PROMPT_LEN), generator=gen)}
        drv, trainers = ("driver", 0), [("trainer", r) for r in range(n)]
        ref = t.call(nm.RAY_PUT, "", ray.put, prompts)
        out = self._call(GEN, ("rollout", 0), self.rollout.generate_sequences, ref)
        batch = self._get(GEN, [out])[0]
        parts = [t.call(nm.RAY_PUT, "", ray.put, s) for s in shards(batch, n)]
        lps = [self._call(LOGPROB, a, w.compute_log_prob, s)
               for a, w, s in zip(trainers, self.trainers, parts)]
        self._get(LOGPROB, lps)
        ups = [self._call(UPDATE, a, w.update_actor, s, lp)
               for a, w, s, lp in zip(trainers, self.trainers, parts, lps)]
        self._get(UPDATE, ups)
        for r in [ref, *parts]:
            t.moved((nm.RAY_PUT, "", *drv), [r])
        self.held = [ref, out, *parts, *lps, *ups]

    def _call(self, method: str, actor: tuple[str, int], fn, *args):
        """A call by ref (nothing passed by value, as verl's), with its worker's side: the
        arguments it reads where it runs (read before the call, so a copy the call brings is
        not yet there) and the result it stores."""
        t = self.truth
        t.moved((nm.RAY_ARGS, method, *actor), list(args), to=self.where[actor])
        result = t.call(nm.RAY_CALL, method, fn.remote, *args)
        t.moved((nm.RAY_CALL, method, "driver", 0), [])
        t.moved((nm.RAY_RETURN, method, *actor), [result])
        return result

    def _announce(self) -> None:
        """Each actor's endpoint, from its file_sd entry (written at its first call)."""
        from ..readback.scrape import targets
        want = {(r, str(k)) for r, k in self.cfg.roles() if r != "driver"}
        while True:
            found = {}
            for tg in targets(self.tel.settings.sd_dir, self.tel.settings.job):
                labels = dict(tg.labels)
                key = (labels.get("role"), labels.get("rank"))
                if key in want:
                    found[key] = tg
            if set(found) == want:
                break
            if self.sync.stop.wait(0.1):
                raise SystemExit(1)
        for (role, rank), tg in sorted(found.items()):
            pid = os.path.basename(tg.file or "").split("@")[0].rsplit("-", 1)[-1]
            self.out.put(("ready", role, int(rank), {"endpoint": tg.address, "pid": pid,
                                                     "instance": tg.address}))

    def _send(self, kind: str) -> None:
        """Each process's truth for the period (warm-up, or the measured steps)."""
        period = self.truth.take()
        for role, rank in self.cfg.roles():
            truth = role_truth(role, rank, period)
            if role == "driver":
                truth.update(steps=self.steps, step_s=self.step_s)
                self.steps, self.step_s = 0, 0.0
            self.out.put((kind, role, rank, truth))


def _driver_process(cfg: Config, sync: Sync, out) -> None:
    import dpobs_otel as dpobs

    die_with_parent(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_term)
    os.environ.update(LOOPBACK_ENV)  # before Ray is imported
    torch.set_num_threads(1)
    tel = None
    try:
        from ..adapters.ray import instrument
        tel = dpobs.start(role="driver", rank=0, job=cfg.job, sd_dir=cfg.sd_dir, host=cfg.host,
                          advertise_host=cfg.advertise_host, trace=cfg.trace or None)
        instrument(tel)
        port = tel.endpoint.rsplit(":", 1)[1]
        out.put(("ready", "driver", 0, {"endpoint": tel.endpoint, "pid": os.getpid(),
                                        "instance": f"{tel.settings.target_host}:{port}"}))
        with ray_up(cfg):
            driver = _Driver(cfg, tel, sync, out)
            driver.loop()
            _wait_parent(sync.release)
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            out.put(("error", "driver", 0, traceback.format_exc()))
    finally:
        if tel is not None:
            tel.shutdown()


@contextlib.contextmanager
def ray_up(cfg: Config):
    """The driver's Ray: a local one, or with --nodes N a cluster of N nodes on this machine
    (ray.cluster_utils.Cluster: each node its own raylet and object store on 127.0.0.1, so
    objects really move between them), shut down on the way out."""
    import ray
    store = {"object_store_memory": OBJECT_STORE_BYTES}
    if cfg.nodes <= 1:
        with ray.init(address="local", _node_ip_address=LOOPBACK_IP, include_dashboard=False,
                      num_cpus=cfg.trainers + 2, log_to_driver=False, **store):
            yield
        return
    from ray.cluster_utils import Cluster
    node = {"node_ip_address": LOOPBACK_IP, "num_cpus": -(-(cfg.trainers + 1) // cfg.nodes),
            **store}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(cfg.nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        with ray.init(address=cluster.address, _node_ip_address=LOOPBACK_IP,
                      log_to_driver=False):
            yield
    finally:
        cluster.shutdown()


class RayWorkload(Workload):
    """Workload's interface over one driver process and its Ray actors (the module docstring).
    start() returns once the warm-up step is done and every process is announced."""

    def start(self, timeout: float = RAY_START_S) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._own_sd = None
        if self.cfg.sd_dir is None:  # the actors are found through their file_sd entries
            self._own_sd = self.cfg.sd_dir = tempfile.mkdtemp(prefix="dpobs-ray-sd-")
        self.sync = Sync(ctx.Barrier(1), ctx.Value("b", 0), ctx.Event(), ctx.Event(),
                         ctx.Event())
        self._queue = ctx.Queue()
        p = ctx.Process(target=_driver_process, name="dpobs-ray-driver", daemon=True,
                        args=(self.cfg, self.sync, self._queue))
        p.start()
        self.procs[("driver", 0)] = p
        self._collect("ready", self.info, timeout)

    def warmup(self, timeout: float = RAY_START_S) -> dict:
        return self._collect("warm", self.warm, timeout)

    def _parties(self) -> int:
        return len(self.cfg.roles())

    def close(self) -> None:
        """As Workload's, with time for the driver to stop Ray (its own processes with it)."""
        if not self._closed and self.procs:
            self.stop()
            self.sync.release.set()
            self.procs[("driver", 0)].join(timeout=60)
        super().close()
        if getattr(self, "_own_sd", None):
            shutil.rmtree(self._own_sd, ignore_errors=True)
            self.cfg.sd_dir = None


