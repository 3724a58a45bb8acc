"""The requests TransferQueue serves for each call dpobs makes: the one table that says, per
release, which controller requests and which storage-unit requests (the op_type values of
TransferQueue's own exporter, exporter.py) one measured call makes, dpobs's own calls
included, so that dpobs's op counts and the store's request counts can stand side by side
(docs/guides/transferqueue.md, "The store's own account", prints it).

A row is a call as the adapter makes it, named `<api>.<op>[:<variant>]`: api `kv` (kv.py: the
kv_* functions, sync and async, kv_put and kv_batch_get_by_meta as their batch forms) or
`client` (client.py: TransferQueueClient and AsyncTransferQueueClient), op the dpobs op it is
counted as (`reconcile`: dpobs's own listing, counted in no op), the variant a case that
makes other requests. Controller counts are per call; storage counts are per storage unit
the call's rows live on (a row lives on unit global_index % units, so a call of n rows with
consecutive indexes touches min(n, units) of them).

What the guard and row age add: nothing. Their digests and stamps ride in the rows' tags,
which every put sends anyway (SET_CUSTOM_META goes out even for rows without tags: each row
has a tag dict, if empty) and every read gets back with the metadata it looks up anyway;
the guarded put and read make kv_batch_put's and kv_batch_get's own steps (digests.py).

Requests TransferQueue makes for itself, in no row: GET_METRICS (the controller's collection,
a manager's probe after a timeout; counted by no request counter), HANDSHAKE (counted
nowhere), a storage request retried after a timeout (0.1.11; counted twice at the unit).
Calls dpobs does not measure make requests in no row either: get_production_status,
get_consumption_status, reset_consumption, get_partition_list, kv_retrieve_keys, the
checkpoints. A call refused before it leaves the client (an argument check) makes none.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from .exporter import (CLEAR_DATA, CLEAR_META, CLEAR_PARTITION, FIRST_RELEASE, GET_DATA,
                       GET_LIST_PARTITIONS, GET_META, GET_PARTITION_META, GET_PRODUCTION,
                       KV_LIST, KV_RETRIEVE_META, MARK_CLEARING, NOTIFY_DATA_UPDATE, PUT_DATA,
                       SET_CUSTOM_META)

__all__ = ["Requests", "CALLS", "TABLE", "COVERAGE", "requests", "per_op", "billed", "expected",
           "installed_release", "markdown"]

RECONCILE = "reconcile"  # the rows of dpobs's own listings (occupancy.py), counted in no op


@dataclass(frozen=True)
class Requests:
    """What one call makes: controller requests by op_type, storage requests by op_type per
    storage unit the call's rows live on."""

    controller: Mapping[str, int] = field(default_factory=dict)
    storage: Mapping[str, int] = field(default_factory=dict)


_V7, _V9, _V10 = FIRST_RELEASE, (0, 1, 9), (0, 1, 10)
_R = Requests

# What each call is, in the words of the call the user (or dpobs) makes.
CALLS = {
    "kv.put": "kv_batch_put or kv_put with fields (any form: async, guarded, stamped)",
    "kv.put:tags": "kv_batch_put or kv_put with tags and no fields",
    "kv.get": "kv_batch_get or kv_batch_get_by_meta, every key stored",
    "kv.get:short": "the same, some keys absent: dpobs lists the partition to name the rows "
                    "that came back (before 0.1.9 TransferQueue raises: kv.get:absent)",
    "kv.get:absent": "the same, no key stored: TransferQueue raises ValueError",
    "kv.list": "kv_list",
    "kv.clear": "kv_clear",
    "kv.clear:absent": "kv_clear, no key stored: nothing to clear",
    "kv.clear:partition": "the protocol's clear_samples(None, partition): its keys listed, "
                          "then one kv_clear",
    "kv.register": "the protocol's register_partition: TransferQueue makes a partition on "
                   "its first put",
    "kv.reconcile": "dpobs's own listing, every reconcile_rows rows put: per partition the "
                    "client holds rows in",
    "client.claim_meta": "get_meta (any mode)",
    "client.put": "put(data, metadata)",
    "client.put:insert": "put(data, partition_id=...) without metadata: dpobs asks for the "
                         "insert metadata first",
    "client.get_data": "get_data",
    "client.clear": "clear_samples",
    "client.clear:partition": "clear_partition of a partition this client put rows in: dpobs "
                              "lists its rows first",
    "client.clear:other_partition": "clear_partition of one it did not put rows in",
    "client.reconcile": "dpobs's own listing, every reconcile_rows rows put: once",
    "client.reconcile:partition": "and per partition the client put rows in that still exists",
}

# call -> ((first release, its requests), ...): a later entry replaces an earlier one from
# its release on. 0.1.10 added MARK_CLEARING before every clear's storage requests.
TABLE: dict[str, tuple[tuple[tuple[int, int, int], Requests], ...]] = {
    "kv.put": ((_V7, _R({KV_RETRIEVE_META: 1, NOTIFY_DATA_UPDATE: 1, SET_CUSTOM_META: 1},
                        {PUT_DATA: 1})),),
    "kv.put:tags": ((_V7, _R({KV_RETRIEVE_META: 1, SET_CUSTOM_META: 1})),),
    "kv.get": ((_V7, _R({KV_RETRIEVE_META: 1}, {GET_DATA: 1})),),
    "kv.get:short": ((_V9, _R({KV_RETRIEVE_META: 1, KV_LIST: 1}, {GET_DATA: 1})),),
    "kv.get:absent": ((_V7, _R({KV_RETRIEVE_META: 1})),),
    "kv.list": ((_V7, _R({KV_LIST: 1})),),
    "kv.clear": ((_V7, _R({KV_RETRIEVE_META: 1, CLEAR_META: 1}, {CLEAR_DATA: 1})),
                 (_V10, _R({KV_RETRIEVE_META: 1, MARK_CLEARING: 1, CLEAR_META: 1},
                           {CLEAR_DATA: 1}))),
    "kv.clear:absent": ((_V7, _R({KV_RETRIEVE_META: 1})),),
    "kv.clear:partition": ((_V7, _R({KV_LIST: 1, KV_RETRIEVE_META: 1, CLEAR_META: 1},
                                    {CLEAR_DATA: 1})),
                           (_V10, _R({KV_LIST: 1, KV_RETRIEVE_META: 1, MARK_CLEARING: 1,
                                      CLEAR_META: 1}, {CLEAR_DATA: 1}))),
    "kv.register": ((_V7, _R()),),
    "kv.reconcile": ((_V7, _R({KV_LIST: 1})),),
    "client.claim_meta": ((_V7, _R({GET_META: 1})),),
    "client.put": ((_V7, _R({NOTIFY_DATA_UPDATE: 1, SET_CUSTOM_META: 1}, {PUT_DATA: 1})),),
    "client.put:insert": ((_V7, _R({GET_META: 1, NOTIFY_DATA_UPDATE: 1, SET_CUSTOM_META: 1},
                                   {PUT_DATA: 1})),),
    "client.get_data": ((_V7, _R({}, {GET_DATA: 1})),),
    "client.clear": ((_V7, _R({CLEAR_META: 1}, {CLEAR_DATA: 1})),
                     (_V10, _R({MARK_CLEARING: 1, CLEAR_META: 1}, {CLEAR_DATA: 1}))),
    "client.clear:partition": (
        (_V7, _R({GET_PRODUCTION: 1, GET_PARTITION_META: 1, CLEAR_PARTITION: 1},
                 {CLEAR_DATA: 1})),
        (_V10, _R({GET_PRODUCTION: 1, GET_PARTITION_META: 1, MARK_CLEARING: 1,
                   CLEAR_PARTITION: 1}, {CLEAR_DATA: 1}))),
    "client.clear:other_partition": (
        (_V7, _R({GET_PARTITION_META: 1, CLEAR_PARTITION: 1}, {CLEAR_DATA: 1})),
        (_V10, _R({GET_PARTITION_META: 1, MARK_CLEARING: 1, CLEAR_PARTITION: 1},
                  {CLEAR_DATA: 1}))),
    "client.reconcile": ((_V7, _R({GET_LIST_PARTITIONS: 1})),),
    "client.reconcile:partition": ((_V7, _R({GET_PRODUCTION: 1})),),
}


# The recording rules' view (mixin/store_rules.py). dpobs's op label does not say which API
# made an op, so coverage counts each op by one request every form of it makes exactly once,
# in either API, and no other op's plain form makes: covered op -> (the dpobs ops it pools,
# where the store counts it, those request types). Reads pool get (kv) and get_data (client):
# their only such request is the storage unit's GET_DATA. claim_meta and list are left out: a
# client put without metadata asks GET_META too, and dpobs's own listings (short reads,
# reconciliation) make KV_LIST; neither moves data. (test_tq_requests.py holds this to TABLE.)
COVERAGE: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "put": (("put",), "controller", (NOTIFY_DATA_UPDATE,)),
    "get": (("get", "get_data"), "storage", (GET_DATA,)),
    "clear": (("clear",), "controller", (CLEAR_META, CLEAR_PARTITION)),
}


def installed_release() -> tuple[int, ...]:
    """The installed TransferQueue's release numbers, e.g. (0, 1, 11)."""
    from importlib.metadata import version

    from ..instrumentation import _release

    return _release(version("transferqueue"))


def requests(call: str, release: tuple[int, ...] | None = None) -> Requests:
    """What `call` (a row of TABLE) makes on `release` (default: the installed one). KeyError
    for an unknown call, LookupError for a release without the exporter."""
    release = installed_release() if release is None else tuple(release)
    found = [r for since, r in TABLE[call] if since <= release]
    if not found:
        raise LookupError(f"TransferQueue {'.'.join(map(str, release))} has no exporter "
                          f"(it arrived in {'.'.join(map(str, FIRST_RELEASE))})")
    return found[-1]


def per_op(api: str, release: tuple[int, ...] | None = None) -> dict[str, Requests]:
    """op -> what one op of the api's plain form makes (`kv` or `client`): the weights that
    turn dpobs's op counts into the requests they made."""
    prefix = api + "."
    return {call[len(prefix):]: requests(call, release) for call in TABLE
            if call.startswith(prefix) and ":" not in call and not call.endswith(RECONCILE)}


def billed() -> dict[str, Requests]:
    """op -> the requests the rules bill one op for (newest release): the union of both APIs'
    plain forms, a kv put's and clear's lookup (KV_RETRIEVE_META) included. A request type the
    store never served has no mean and bills nothing, so a client-API job is not billed the kv
    lookup; a job mixing both APIs bills its client puts and clears one lookup too many."""
    newest = max(since for entries in TABLE.values() for since, _ in entries)
    out: dict[str, Requests] = {}
    for api in ("kv", "client"):
        for op, made in per_op(api, newest).items():
            have = out.get(op, Requests())
            out[op] = Requests({**made.controller, **have.controller},
                               {**made.storage, **have.storage})
    return {op: r for op, r in out.items() if r.controller or r.storage}


def expected(calls: Mapping[str, int], release: tuple[int, ...] | None = None,
             units: int = 1) -> tuple[Counter, Counter]:
    """(controller, storage) request counts by op_type that `calls` (call -> how many) make,
    each call's rows on `units` storage units."""
    controller, storage = Counter(), Counter()
    for call, n in calls.items():
        made = requests(call, release)
        for kind, k in made.controller.items():
            controller[kind] += n * k
        for kind, k in made.storage.items():
            storage[kind] += n * k * units
    return controller, storage


def markdown() -> str:
    """TABLE as docs/guides/transferqueue.md prints it (a test holds the two equal)."""
    rows = ["| call | what it is | dpobs op | from | controller requests, per call | "
            "storage requests, per unit the rows live on |", "|---|---|---|---|---|---|"]
    for call, entries in TABLE.items():
        op = call.partition(".")[2].partition(":")[0]
        rows.append(f"| `{call}` | {CALLS[call]} | {'-' if op == RECONCILE else op} | "
                    f"{_v(entries[0][0])} | {_cell(entries, 'controller')} | "
                    f"{_cell(entries, 'storage')} |")
    return "\n".join(rows)


def _cell(entries, side: str) -> str:
    """One side's request types over a call's releases: `TYPE`, `2 x TYPE`, and the releases
    a type is made in when that is not all of them ("0.1.10 on", "before 0.1.10")."""
    made = [getattr(r, side) for _, r in entries]
    out = []
    for kind in dict.fromkeys(k for m in reversed(made) for k in m):  # the newest's order
        where = [i for i, m in enumerate(made) if kind in m]
        n = made[where[0]][kind]
        text = kind if n == 1 else f"{n} x {kind}"
        if where[-1] < len(made) - 1:
            text += f" (before {_v(entries[where[-1] + 1][0])})"
        if where[0] > 0:
            text += f" ({_v(entries[where[0]][0])} on)"
        out.append(text)
    return ", ".join(out) or "-"


def _v(release) -> str:
    return ".".join(map(str, release))
