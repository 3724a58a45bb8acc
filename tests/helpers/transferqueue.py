"""What the live TransferQueue tests (tests/adapters/transferqueue/) share besides their
fixtures (in that folder's conftest.py): the series they read and the timeout of one call."""
from __future__ import annotations

OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"
MISSING = "dpobs_client_rows_missing_total"
ERRORS = "dpobs_client_operation_errors_total"
T = 60  # seconds: the timeout of one TransferQueue call


def _release() -> tuple:
    import importlib.metadata

    return tuple(int(x) for x in importlib.metadata.version("transferqueue").split(".")[:3])


# What the installed TransferQueue release does that earlier ones did not (`make compat` runs
# these tests on every release 0.1.6-0.1.11):
#   * from 0.1.7, the puts take a data_parser;
#   * from 0.1.10, kv_list of a partition id that is not a string fails: before, it never
#     returns, bare or measured, and TransferQueue answers nothing after it (the exception
#     ends its controller's request loop, which 0.1.10 restarts), so it is not tried there;
#   * from 0.1.9, a read that names absent keys drops them and returns the rest (a short
#     read); before, it returns no rows and kv_batch_get raises ValueError("keys or partition
#     were not found!"), which the adapter raises as well, counted as a failed get.
RELEASE = _release()
DATA_PARSER = RELEASE >= (0, 1, 7)
LIST_REFUSES = RELEASE >= (0, 1, 10)
SHORT_READS = RELEASE >= (0, 1, 9)
