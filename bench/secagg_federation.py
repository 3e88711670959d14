"""A secure federation of many clients on one machine: one coordinator, a few ``lorm-client --sessions`` processes.

For ``N`` clients: a ``lorm-server`` process and ``--processes`` client processes, each hosting its share of the
clients (``client/host.py``: every client a whole session over its own gRPC channel on loopback, with its own
certificate in the signed mode), run ``--method`` on synthetic data (``ridge``: a closed-form head, one secure
step; ``lorm``: LoRM on the tiny model, three secure steps a task) with secure aggregation on ``--graph`` in
``--mode``. ``--drop`` of the clients (the last ones: random places on a sparse graph's ring) sit in a process of
their own that is SIGKILLed at its first masked input (fault point ``client.masked``: after the share round
closed, so every one of them has shared by then; at its first result some were still sharing); each round then waits
``--deadline`` seconds for them and closes with the survivors. Then the same configuration runs through the
in-process transport (``engine.simulation.run_inprocess``, the same clients dropping after sharing).

Figures: the wall time of each run (the processes' start-up and every client building its model included); per
secure step, the coordinator's seconds from its history and the bytes received per client; the coordinator's
peak resident memory (``VmHWM``) and its state directory's peak size on disk (polled every 0.2 s); and whether the
two runs wrote bit-identical heads and adapters.

Usage::

    OMP_NUM_THREADS=1 python bench/secagg_federation.py --clients 1000 --processes 4 --method ridge --drop 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from safetensors.torch import load_file

from common.run.config import RunConfig
from engine.dropouts import drops_after_sharing
from engine.simulation import run_inprocess
from server.certs import create_dev_pki

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ("head.safetensors", "adapter/adapter_model.safetensors")


def federation_config(n: int, method: str, graph: str, mode: str) -> RunConfig:
    return RunConfig(
        run_id="federation",
        num_clients=n,
        num_tasks=1,
        rounds_per_task=1,
        method=method,
        local_epochs=1,
        rank=2,
        lr=3e-2,
        lr_lora=1e-3,
        threads=1,
        seed=9,
        min_client_samples=1,  # about 32 samples a client: a Dirichlet(0.5) split with 6 each is rare at n = 1000
        extra={"synthetic_classes": 8, "synthetic_train": 4 * n, "synthetic_test": 10},
        settings={"secagg": {"enabled": True, "graph": graph, "mode": mode}},
    )


class Watch:
    """The peak total size of the files under ``root`` and process ``pid``'s peak resident memory, polled in a thread
    until :meth:`stop`."""

    def __init__(self, root: Path, pid: int) -> None:
        self.root, self.pid, self.peak, self.rss, self._stop = root, pid, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _size(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(folder, f))
                except OSError:
                    pass  # written and replaced while walking
        return total

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._size())
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.rss = max(self.rss, int(line.split()[1]) * 1024)
            except OSError:
                pass  # the process has exited

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.peak, self.rss


def over_the_wire(config: RunConfig, processes: int, gone: list[int], deadline: float, root: Path) -> dict:
    """The run over gRPC: its wall time, the coordinator's peak memory and disk, its history and results."""
    n = config.num_clients
    (root / "config.json").write_text(config.to_json())
    signed = config.settings["secagg"]["mode"] == "signed"
    ids = [f"client-{i}" for i in range(n)]
    pki = create_dev_pki(root / "tls", ids) if signed else None
    security = ["--insecure"] if pki is None else ["--tls-ca", str(pki.ca)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    port_file = root / "port"
    server_flags = [*security] if pki is None else [*security, "--tls-cert", str(pki.server_cert)]
    if pki is not None:
        server_flags += ["--tls-key", str(pki.server_key), "--allowed-clients", ",".join(ids)]
    logs = open(root / "server.log", "w")
    start = time.monotonic()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "server.main", "--config", str(root / "config.json")),
            *("--state-dir", str(root / "state"), "--results-dir", str(root / "results")),
            # lingers until every live client has pulled the end of the run (at 0 some missed it and retried for
            # their whole --give-up); the gone clients never do, so it lingers its full 60 s: run_s is without it
            *("--port", "0", "--port-file", str(port_file), "--linger", "60"),
            *("--round-deadline", str(deadline), "--quorum", str(n - len(gone))),
            *server_flags,
        ],
        cwd=ROOT,
        env=env,
        stdout=logs,
        stderr=subprocess.STDOUT,
    )
    while not port_file.exists():
        if server.poll() is not None:
            raise RuntimeError((root / "server.log").read_text()[-3000:])
        time.sleep(0.1)
    watch = Watch(root / "state", server.pid)
    target = f"127.0.0.1:{port_file.read_text()}"
    alive = n - len(gone)
    per = -(-alive // processes)
    groups = [(first, min(per, alive - first), False) for first in range(0, alive, per)]
    groups += [(alive, len(gone), True)] if gone else []
    hosts = []
    for first, count, drops in groups:
        own = [] if pki is None else ["--tls-cert", str(pki.out / "clients" / "{client_id}.crt")]
        own += [] if pki is None else ["--tls-key", str(pki.out / "clients" / "{client_id}.key")]
        hosts.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "client.main", "--server", target, "--client-id", "client"),
                    *("--index", str(first), "--sessions", str(count), "--give-up", "900", "--log-format", "json"),
                    *("--privacy-ledger", str(root / "ledgers" / "{client_id}.json")),  # each its own account
                    *security,
                    *own,
                ],
                cwd=ROOT,
                env={**env, "LORM_FAULT": "client.masked:1"} if drops else env,
                stdout=open(root / f"host-{first}.log", "w"),
                stderr=subprocess.STDOUT,
            )
        )
    code = server.wait()
    wall = time.monotonic() - start
    disk, memory = watch.stop()
    for h in hosts:
        h.wait(timeout=120)
    logs.close()
    if code != 0:
        raise RuntimeError(f"the coordinator exited {code}: {(root / 'server.log').read_text()[-3000:]}")
    metrics = json.loads((root / "results" / "metrics.json").read_text())
    return {
        "wall_s": wall,
        "run_s": metrics["seconds"],
        "disk_peak": disk,
        "rss_peak": memory,
        "history": metrics["history"],
    }


STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def step_times(log: Path) -> list[tuple[float, float]]:
    """Per secure step, from the coordinator's log: seconds from its roster to its merge, and from the close of
    its masked inputs to its merge (the unmasking, the sum's checks and the merge)."""
    out: list[tuple[float, float]] = []
    roster = inputs = None
    for line in log.read_text().splitlines():
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if "secure aggregation: roster of" in line and roster is None:
            roster = at
        elif "secure aggregation: masked inputs of" in line:
            inputs = at
        elif " merged (" in line and roster is not None and inputs is not None:
            out.append((at - roster, at - inputs))
            roster = inputs = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--processes", type=int, default=4, help="client processes of survivors (one more drops)")
    parser.add_argument("--method", default="ridge")
    parser.add_argument("--graph", default="sparse", choices=("complete", "sparse"))
    parser.add_argument("--mode", default="honest", choices=("honest", "signed"))
    parser.add_argument("--drop", type=float, default=0.1, help="share of clients gone after sharing their keys")
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds a round waits for the gone clients")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process run")
    parser.add_argument("--keep", type=Path, help="run in this (new) directory and keep it: logs, state, results")
    args = parser.parse_args(argv)
    config = federation_config(args.clients, args.method, args.graph, args.mode)
    gone = list(range(args.clients - int(round(args.drop * args.clients)), args.clients))
    with tempfile.TemporaryDirectory(prefix="secagg-federation-") as tmp:
        root = Path(args.keep or tmp)
        (root / "wire").mkdir(parents=True)
        wire = over_the_wire(config, args.processes, gone, args.deadline, root / "wire")
        print(
            f"{args.method}, {args.clients} clients in {args.processes} processes (+1 of {len(gone)} dropping), "
            f"{args.graph} graph, {args.mode}: wall {wire['wall_s']:.1f} s (the run {wire['run_s']:.1f} s), "
            "coordinator peak RSS "
            f"{wire['rss_peak'] / 1e6:.0f} MB, state directory peak {wire['disk_peak'] / 1e6:.1f} MB",
            flush=True,
        )
        steps = step_times(root / "wire" / "server.log")
        secure = [h for h in wire["history"] if h.get("secagg")]
        for h, (whole, unmask) in zip(secure, steps):
            s = h["secagg"]
            print(
                f"  {h['phase']} {h.get('factors', '')}: roster to merged {whole:.1f} s, inputs closed to merged "
                f"{unmask:.1f} s; {s['survivors']} survivors, {s['graph']} k={s['neighbours']} t={s['threshold']}, "
                f"{s['bytes_per_client'] / 1e3:.1f} kB/client"
            )
        if args.no_inprocess:
            return 0
        start = time.monotonic()
        run_inprocess(
            config, results_dir=root / "inprocess", sessions=drops_after_sharing(set(gone)), deadline_s=args.deadline
        )
        equal = all(
            _same(root / "wire" / "results" / name, root / "inprocess" / name)
            for name in RESULTS
            if (root / "inprocess" / name).exists()
        )
        print(f"in process: wall {time.monotonic() - start:.1f} s; results bit-identical: {equal}")
    return 0


def _same(a: Path, b: Path) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)


if __name__ == "__main__":
    raise SystemExit(main())
