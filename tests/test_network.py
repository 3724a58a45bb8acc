"""The suite never sends a packet off this machine.

`make test` runs pytest in a network namespace that has only loopback when it can (root,
`unshare --net`, `ip link set lo up`); `.ci/run` always does. These tests prove the isolation
from inside: the only interface is `lo`, loopback still carries traffic, and a connect to an
address off the machine fails at once with ENETUNREACH instead of leaving.

Under CI (CI=true) a run outside such a namespace FAILS here; elsewhere it skips, saying why.
No connect to an off-machine address is attempted unless `lo` is the only interface, so the
check itself cannot leak a packet on a machine where it would not be isolated.
"""
from __future__ import annotations

import errno
import shutil
import socket
import subprocess

import pytest
from helpers import IN_CI, network_isolation

# Documentation (TEST-NET-1), the cloud metadata service Ray probes, a public resolver.
OFF_MACHINE = [("192.0.2.1", 80), ("169.254.169.254", 80), ("8.8.8.8", 53)]


def require_isolation() -> None:
    """Fail (CI) or skip (elsewhere) unless loopback is this namespace's only interface; a
    plain call, not a fixture, so that under CI it is the test that fails, not its setup."""
    reason = network_isolation()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but the suite is not in a loopback-only network namespace: "
                    f"{reason}. Run it through `make test` as root (.ci/run does).")
    pytest.skip(f"not in a loopback-only network namespace ({reason}); `make test` as root "
                "runs the suite in one")


def test_only_loopback_interface():
    require_isolation()
    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    ip = shutil.which("ip")
    if ip is None and IN_CI:
        pytest.fail("iproute2's `ip` is missing: .ci/run must install it")
    if ip is not None:
        out = subprocess.run([ip, "-o", "link"], capture_output=True, text=True, timeout=10,
                             check=True).stdout
        links = [line.split(":")[1].strip() for line in out.splitlines() if line.strip()]
        assert links == ["lo"], out


def test_loopback_carries_traffic():
    require_isolation()
    # Isolation that also killed loopback would pass the other tests and break every server.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            peer, _ = server.accept()
            with peer:
                c.sendall(b"ping")
                assert peer.recv(4) == b"ping"


@pytest.mark.parametrize("address", OFF_MACHINE, ids=lambda a: f"{a[0]}:{a[1]}")
def test_tcp_connect_off_machine_is_unreachable(address):
    require_isolation()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)  # a leak would hang or be refused remotely, never ENETUNREACH
        with pytest.raises(OSError) as info:
            s.connect(address)
    assert info.value.errno == errno.ENETUNREACH, info.value


def test_udp_send_off_machine_is_unreachable():
    require_isolation()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        with pytest.raises(OSError) as info:
            s.sendto(b"x", ("192.0.2.1", 53))
    assert info.value.errno == errno.ENETUNREACH, info.value
