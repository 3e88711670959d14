"""``lorm-ledger``: the site operator's view of a client's privacy ledger, and the one way to reset it.

``lorm-ledger show FILE`` prints each run the file's records took part in (its id, budget and what it spent) and the
epsilon spent over all of them; ``lorm-ledger reset FILE --yes`` empties it, keeping a copy beside it
(``FILE.<time>.bak``). No coordinator can do either: the client only ever adds to its ledger.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from client.ledger_file import LedgerRefused, read_ledger


def show(path: Path) -> int:
    state = read_ledger(path)
    runs = state["runs"].values()
    print(f"privacy ledger {path}: data {state['data']}")
    for run in sorted(runs, key=lambda r: r["run_id"]):
        released = ", ".join(f"task {t}: {r} rounds, {g} Gram releases" for t, (r, g) in run["released"].items())
        budget = f"budget epsilon {run['epsilon']:g}, delta {run['delta']:g} ({run['mode']})" if run["epsilon"] else ""
        print(f"  run {run['run_id']}: {budget or 'no budget'}; spent epsilon {run['spent']:.4g}; {released or '-'}")
    spent = [r for r in runs if r["spent"] > 0]
    total, delta = sum(r["spent"] for r in spent), sum(r["delta"] for r in spent)
    print(f"  over {len(spent)} runs that spent: epsilon {total:.4g}, delta {delta:.3g} (basic composition)")
    print(f"  {len(state['masked'])} secure sums' inputs written down (never masked again)")
    return 0


def reset(path: Path, yes: bool) -> int:
    read_ledger(path)  # a file that is a ledger: nothing else is moved aside
    if not yes:
        print(f"lorm-ledger: resetting {path} forgets what its records released; pass --yes", file=sys.stderr)
        return 2
    backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}.bak")
    shutil.copy2(path, backup)
    path.unlink()
    print(f"privacy ledger {path} reset; its account kept as {backup}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lorm-ledger", description="Show or reset a client's privacy ledger.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show", help="what the ledger's records released, run by run").add_argument("file", type=Path)
    reset_parser = sub.add_parser("reset", help="empty the ledger (the site's operator only), keeping a copy")
    reset_parser.add_argument("file", type=Path)
    reset_parser.add_argument("--yes", action="store_true", help="yes, forget what the records released")
    args = parser.parse_args(argv)
    try:
        return show(args.file) if args.command == "show" else reset(args.file, args.yes)
    except LedgerRefused as err:
        print(f"lorm-ledger: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
