"""A verl-shaped Ray job, unchanged by dpobs: a driver puts each chunk of a batch from a thread
pool (as verl's parallel_put does), calls rollout actors by reference and a scorer by value,
collects the results with ray.get, and meets a timeout, a method that raises, an async actor
that awaits a ref and a killed actor. It records its own truth beside: how many calls of each
it made, Ray's object sizes of what it put and got back (ray.experimental.get_object_locations),
the errors it caught by class, and a digest of every result. Before it shuts Ray down it
scrapes every dpobs target registered in DPOBS_SD_DIR, if any, so the test can hold the
numbers of every process against the truth.

    python -m helpers.ray_job OUT.json        # the environment says whether dpobs is on
    RAYJOB_ADDRESS=127.0.0.1:PORT python -m helpers.ray_job OUT.json   # join that cluster

Run by tests/adapters/ray/test_ray_job.py in a subprocess, as a user would run a driver.
"""
from __future__ import annotations

import asyncio
import glob
import hashlib
import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray

from helpers.ray_runs import forwarded, job_main

CHUNKS = 2
ROWS = 2048  # per chunk: 2048 x 64 float32 = 512 KiB, above Ray's 100 KiB inline limit


@ray.remote
class Rollout:
    def generate_sequences(self, chunk):
        return {"responses": chunk["prompts"] * 2.0, "lengths": chunk["lengths"] + 1}

    def ping(self):
        return os.getpid()


@ray.remote
class Scorer:
    def score(self, chunk, scale=1.0):
        return chunk["prompts"].sum(axis=1) * scale

    def slow(self):
        time.sleep(2.0)
        return 0

    def boom(self):
        raise ValueError("a method that raises")


@ray.remote
class Critic:
    async def compute_values(self, refs):
        chunk = await refs[0]  # an async actor awaiting a ref it was handed inside a list
        await asyncio.sleep(0)
        return chunk["prompts"].mean(axis=1)


def _chunk(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"prompts": rng.standard_normal((ROWS, 64)).astype(np.float32),
            "lengths": np.arange(ROWS, dtype=np.int64) + i}


def _sizes(refs) -> list[int]:
    locations = ray.experimental.get_object_locations(refs)
    return [int(locations[r]["object_size"]) for r in refs]


def _digest(value) -> str:
    h = hashlib.sha256()
    for part in value if isinstance(value, list) else [value]:
        if isinstance(part, dict):
            for k in sorted(part):
                h.update(k.encode() + part[k].tobytes())
        else:
            h.update(np.asarray(part).tobytes())
    return h.hexdigest()


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # the class as the user's except clause sees it
        return type(exc).__name__
    return None


def _killed(victim) -> tuple[str | None, int]:
    """Call a killed actor until the call fails (the kill lands asynchronously): the error
    class the caller saw, and how many pings it took. Returns once its process has gone too:
    Ray fails the calls first, and a scrape in between (a loaded machine) still finds the
    killed actor serving its metrics."""
    pid = ray.get(victim.ping.remote())
    ray.kill(victim, no_restart=True)
    for n in range(2, 200):
        error = _error(lambda: ray.get(victim.ping.remote(), timeout=30))
        if error is not None:
            _gone(pid)
            return error, n
        time.sleep(0.05)
    return None, n


def _gone(pid: int, timeout: float = 30.0) -> None:
    """Wait until process `pid` has exited (a zombie counts: it serves nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the killed actor's process {pid} still runs after {timeout} s")


def job() -> dict:
    truth: dict = {"calls": {}, "errors": {}}
    chunks = [_chunk(i) for i in range(CHUNKS)]
    rollouts = [Rollout.remote() for _ in range(CHUNKS)]
    scorer, critic = Scorer.remote(), Critic.remote()
    with ThreadPoolExecutor(max_workers=CHUNKS) as pool:  # verl's parallel_put
        refs = list(pool.map(ray.put, chunks))
    truth["put_sizes"] = _sizes(refs)
    generated = [r.generate_sequences.remote(ref) for r, ref in zip(rollouts, refs)]
    scored = [scorer.score.remote(chunks[0], scale=0.5)]  # by value, with a keyword
    valued = [critic.compute_values.remote([refs[1]])]
    truth["calls"] = {"Rollout.generate_sequences": CHUNKS, "Scorer.score": 1,
                      "Critic.compute_values": 1, "Scorer.slow": 1, "Scorer.boom": 1}
    results = ray.get(generated) + ray.get(scored) + ray.get(valued)
    truth["result_sizes"] = {"Rollout.generate_sequences": sum(_sizes(generated)),
                             "Scorer.score": sum(_sizes(scored)),
                             "Critic.compute_values": sum(_sizes(valued))}
    truth["digest"] = _digest(results)
    truth["errors"]["Scorer.slow"] = _error(
        lambda: ray.get(scorer.slow.remote(), timeout=0.2))
    truth["errors"]["Scorer.boom"] = _error(lambda: ray.get(scorer.boom.remote()))
    truth["errors"]["Rollout.ping"], truth["calls"]["Rollout.ping"] = _killed(rollouts[0])
    truth["refs_alive"] = len(refs)
    truth["sdk_degradations"] = _sdk_degradations()
    truth["metrics"] = scrape_all(os.environ.get("DPOBS_SD_DIR"))
    return truth


def _sdk_degradations() -> list[str]:
    """What of the OpenTelemetry SDK's private names this driver's dpobs found missing (an
    older SDK, the floor cell's): every process meets the same at its start and counts it
    under otel_sdk, by design. Read only where dpobs is already loaded (DPOBS_AUTO)."""
    shim = sys.modules.get("dpobs_otel.shims.otel_sdk")
    return sorted(shim.degradations()) if shim is not None else []


def scrape_all(sd_dir: str | None) -> list[dict]:
    """Every registered dpobs target's labels and samples, [name, labels, value] each (not
    the stores' own exporters registered beside them: Ray's nodes)."""
    from prometheus_client.parser import text_string_to_metric_families

    from dpobs_otel.names import STORE_ROLES
    out = []
    for path in sorted(glob.glob(os.path.join(sd_dir or "/nonexistent", "*.json"))):
        for entry in json.load(open(path)):
            if entry["labels"].get("role") in STORE_ROLES:
                continue
            for target in entry["targets"]:
                try:
                    body = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read()
                except OSError:  # a killed actor's file stays behind it
                    out.append({"labels": entry["labels"], "samples": None})
                    continue
                samples = [[s.name, s.labels, s.value]
                           for f in text_string_to_metric_families(body.decode())
                           for s in f.samples if s.name.startswith("dpobs_")]
                # No dpobs series: the port of a killed actor, already bound again by
                # another process (another xdist worker's, in `make test`'s parallel run).
                out.append({"labels": entry["labels"], "samples": samples or None})
    return out


def main() -> None:
    address = os.environ.get("RAYJOB_ADDRESS")  # a cluster `ray start --head` runs
    own = {} if address else {"num_cpus": 4, "include_dashboard": False,
                              "object_store_memory": 100 * 1024**2}
    job_main(job, address=address or "local", runtime_env={"env_vars": forwarded()}, **own)


if __name__ == "__main__":
    main()
