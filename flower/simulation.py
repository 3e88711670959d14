"""The run on Flower's simulation engine from Python: the ServerApp and ClientApp of this package, as many virtual
nodes as the run has clients, on Flower's Ray backend (``flwr.simulation.run_simulation``; ``flwr run`` on a local
simulation federation runs the same apps).

``python -m flower.simulation --preset tiny --results-dir DIR`` takes ``lorm-sim``'s configuration flags.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from common.run.config import RunConfig
from flower.client_app import app as client_app
from flower.server_app import FlowerRelay, Settings, drive, settings


def simulate(
    config: RunConfig,
    run_config: Mapping[str, Any] | None = None,
    *,
    cpus: int = 1,
    nodes: ClientApp = client_app,
    supernodes: int | None = None,
) -> FlowerRelay:
    """``config`` run on the simulation engine, one virtual node per client (or ``supernodes``, of which those past
    ``num_clients`` take no part), ``cpus`` ClientApps at a time; the coordinator as the run left it (``nodes``: the
    ClientApp every node runs). Returns the relay: its coordinator as the run left it, the bytes it carried. The
    ServerApp's failure (a refusal, a node's) is raised here."""
    outcome: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lorm-flower-") as scratch:
        path = Path(scratch) / "config.json"
        path.write_text(config.to_json())
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            try:
                s: Settings = settings({"nodes-timeout": 120, **(run_config or {}), "lorm-args": f"--config {path}"})
                outcome["relay"] = drive(grid, s)
            except BaseException as err:  # raised again in the caller's thread
                outcome["error"] = err
                raise

        run_simulation(
            app,
            nodes,
            num_supernodes=supernodes or config.num_clients,
            backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": cpus}},
        )
    if "error" in outcome:
        raise outcome["error"]
    if "relay" not in outcome:
        raise RuntimeError("the simulation engine ended before the ServerApp did")
    return outcome["relay"]


def main(argv: list[str] | None = None) -> int:
    from common.methods.checks import validate
    from common.run.arguments import add_config_arguments
    from common.run.metrics import format_summary
    from common.run.schedule import add_schedule_arguments, config_with_schedule

    parser = argparse.ArgumentParser(prog="python -m flower.simulation", description=__doc__)
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    parser.add_argument("--results-dir", default="", help="write adapter, head, metrics and plot here")
    parser.add_argument("--state-dir", default="", help="commit the run here after every step; resume from it")
    parser.add_argument("--cpus", type=int, default=1, help="ClientApps run at a time (Ray's CPUs)")
    args = parser.parse_args(argv)
    try:
        config = validate(config_with_schedule(args))
    except (OSError, ValueError) as err:
        parser.error(str(err))
    coord = simulate(config, {"results-dir": args.results_dir, "state-dir": args.state_dir}, cpus=args.cpus).coord
    print(format_summary({"config": {}, "seconds": coord.run.seconds, **coord.run.matrix.summary()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
