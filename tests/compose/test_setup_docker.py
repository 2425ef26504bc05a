"""scripts/setup_docker.sh --stop removes what its dockerd added to the host's firewall, and nothing else."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.compose.stack import DOCKERD_PIDFILE, ROOT, docker_engine_answers

pytestmark = pytest.mark.docker

#: rules of "someone else's firewall": one there before dockerd starts, one added while it runs.
KEEP_BEFORE = "-t nat -A POSTROUTING -s 10.99.0.0/16 -m comment --comment farm-keep-1 -j RETURN".split()
KEEP_DURING = "-A INPUT -s 10.98.0.0/16 -m comment --comment farm-keep-2 -j ACCEPT".split()
KEEP_CHAIN = "FARM-TEST-KEEP"


def _iptables(*args: str, check: bool = True) -> str:
    return subprocess.run(["iptables", *args], capture_output=True, text=True, check=check).stdout


def _save() -> str:
    return subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def host_firewall() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("starts dockerd and edits iptables: root only")
    if docker_engine_answers() or DOCKERD_PIDFILE.exists():
        pytest.skip("a Docker engine already runs here: this test needs to start its own")
    _iptables(*KEEP_BEFORE)
    _iptables("-N", KEEP_CHAIN)
    try:
        yield
    finally:
        _iptables(*["-D" if a == "-A" else a for a in KEEP_BEFORE], check=False)
        _iptables(*["-D" if a == "-A" else a for a in KEEP_DURING], check=False)
        _iptables("-X", KEEP_CHAIN, check=False)


@pytest.mark.usefixtures("host_firewall")
def test_setup_docker_stop_removes_only_what_its_dockerd_added() -> None:
    forward_policy = _iptables("-S", "FORWARD").splitlines()[0]
    # Given a dockerd started by the script (it adds its chains, NAT rules and FORWARD policy)
    subprocess.run(["scripts/setup_docker.sh"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    try:
        assert "DOCKER" in _save()
        # and a rule of the host's own added while it runs
        _iptables(*KEEP_DURING)
    finally:
        # When the script stops it
        subprocess.run(["scripts/setup_docker.sh", "--stop"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    # Then Docker's chains and rules are gone, the host's rules and chain are still there, and the
    # FORWARD policy is what it was
    after = _save()
    assert "DOCKER" not in after and "docker0" not in after
    assert "farm-keep-1" in after and "farm-keep-2" in after and f":{KEEP_CHAIN}" in after
    assert _iptables("-S", "FORWARD").splitlines()[0] == forward_policy
    assert subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode != 0
