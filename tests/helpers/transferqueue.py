"""What the live TransferQueue tests (tests/adapters/transferqueue/) share besides their
fixtures (in that folder's conftest.py): the series they read and the timeout of one call."""
from __future__ import annotations

OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"
MISSING = "dpobs_client_rows_missing_total"
ERRORS = "dpobs_client_operation_errors_total"
T = 60  # seconds: the timeout of one TransferQueue call
