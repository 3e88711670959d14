"""One coordinator per state directory and per port. A second ``lorm-server`` given a state directory that a running
coordinator holds, or its port, refuses to start and says why: two coordinators writing one run's state would
corrupt it, and two on one port would split the clients between them (gRPC binds with ``SO_REUSEPORT`` unless told
not to, and the kernel then spreads new connections over both). A killed coordinator's successor takes the
directory at once: the lock is the kernel's, freed when its holder exits however it exits."""

from __future__ import annotations

import sys

from common.run.config import RunConfig

from procs import ProjectProc as Proc
from procs import free_port


def second(cluster, state: str, port: int) -> Proc:
    """``lorm-server`` on ``cluster``'s configuration with the state directory ``state`` (in its run folder)."""
    argv = ["--config", str(cluster.config), "--state-dir", str(cluster.run_dir / state), "--port", str(port)]
    return Proc("second", [sys.executable, "-m", "server.main", *argv, "--insecure"])


def test_a_second_coordinator_refuses_a_held_state_dir_or_port_and_a_killed_ones_successor_starts(cluster):
    c = cluster(RunConfig(run_id="one", num_clients=1).to_json(), insecure=True)
    first = c.server()
    first.wait_for("serving on", timeout=30)

    same_dir = second(c, "state", free_port())
    assert same_dir.wait(timeout=30) == 2, "".join(same_dir.lines)
    said = "".join(same_dir.lines)
    assert str(c.run_dir / "state") in said and "held by a running coordinator or engine" in said, said
    assert f"pid {first.proc.pid}" in said, said  # who holds it, from the lock file

    same_port = second(c, "other-state", c.port)
    assert same_port.wait(timeout=30) == 2, "".join(same_port.lines)
    said = "".join(same_port.lines)
    assert f"127.0.0.1:{c.port}" in said and "in use" in said, said
    assert first.proc.poll() is None  # the first coordinator serves on, untouched

    first.kill()  # SIGKILL: no handler runs, the kernel frees the lock
    successor = c.server()
    successor.wait_for("serving on", timeout=30)
