"""Separate hosts on one machine, for tests: Linux network namespaces on one private switch.

Each :class:`Host` is a network namespace with its own ``eth0`` and address in ``10.77.0.0/24``
and its own ``/etc/hosts`` (``ip netns exec`` mounts ``/etc/netns/<ns>/hosts``), so processes
in it dial each other by name, as containers on a compose network do. The switch is a bridge
inside a namespace of its own: nothing is added to the machine's own network, and two labs
never see each other. :meth:`Lab.cut` and :meth:`Lab.restore` pull and replug one host's cable
(the switch side of its veth pair). Needs root; :func:`unavailable` says why a lab cannot run.

    with Lab() as lab:
        a = lab.host("coordinator")
        b = lab.host("client-0", hosts={"coordinator": a.address})
        server = a.spawn("server", ["lorm-server", ...])
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from procs import Proc

SUBNET = "10.77.0"  # /24; host k gets .k+1
ETC_NETNS = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return out


def unavailable() -> str | None:
    """Why network namespaces cannot be used here (``None`` if they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"lprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    try:
        link = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if link.returncode != 0:
            return f"cannot create a bridge in a namespace: {link.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Host:
    def __init__(self, lab: Lab, name: str, ns: str, address: str, port_name: str) -> None:
        self.lab, self.name, self.ns, self.address, self.port_name = lab, name, ns, address, port_name

    def spawn(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> Proc:
        """Run ``cmd`` inside this host's namespace (``ip netns exec`` execs it: same pid)."""
        proc = Proc(name, ["ip", "netns", "exec", self.ns, *cmd], env, cwd)
        self.lab.procs.append(proc)
        return proc


class Lab:
    """A switch and the hosts plugged into it; :meth:`close` removes everything, also after a failure."""

    def __init__(self) -> None:
        self.tag = f"l{secrets.token_hex(2)}"  # short: interface names hold 15 characters
        self.switch = f"{self.tag}-switch"
        self.hosts: list[Host] = []
        self.procs: list[Proc] = []
        self._namespaces: list[str] = []

    def __enter__(self) -> Lab:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def host(self, name: str, hosts: dict[str, str] | None = None) -> Host:
        """A new host on the switch; ``hosts``: name -> address entries of its /etc/hosts."""
        k = len(self.hosts)
        ns, address = f"{self.tag}-{name}", f"{SUBNET}.{k + 1}"
        inside, outside = f"{self.tag}h{k}", f"{self.tag}s{k}"
        self._add_namespace(ns)
        etc = ETC_NETNS / ns
        etc.mkdir(parents=True, exist_ok=True)
        entries = {"localhost": "127.0.0.1", name: address, **(hosts or {})}
        (etc / "hosts").write_text("".join(f"{a} {n}\n" for n, a in entries.items()))
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        _ip("link", "set", inside, "netns", ns)
        _ip("link", "set", outside, "netns", self.switch)
        _ip("-n", ns, "link", "set", inside, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", outside, "master", "br0")
        _ip("-n", self.switch, "link", "set", outside, "up")
        host = Host(self, name, ns, address, outside)
        self.hosts.append(host)
        return host

    def cut(self, host: Host) -> None:
        """Unplug ``host`` from the switch: its packets go nowhere until :meth:`restore`."""
        _ip("-n", self.switch, "link", "set", host.port_name, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port_name, "up")

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.resume()  # a stopped process ignores SIGKILL until it runs again on some kernels
                proc.kill()
            except (OSError, subprocess.TimeoutExpired):
                pass
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)  # removes its veth ends and the bridge
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        self._namespaces.clear()
