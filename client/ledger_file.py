"""The privacy ledger's file and what keys it: ``data_digest`` (whose records the file accounts for, and its name,
``ledger_path``), ``config_digest`` (a run's entry, ``RunEntry``), ``inputs_digest`` (a secure step's inputs whose
sum may be out), the file's version and ``read_ledger``, and ``LedgerRefused``, how the account refuses a run.
``client.ledger.ClientLedger`` keeps the account in it; ``lorm-ledger`` (``client.ledger_cli``) reads and resets it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.run.config import RunConfig
from common.run.schedule import bare_config
from common.wire.messages import RoundPlan

VERSION = 2


class LedgerRefused(ValueError):
    """This client's account refuses the run: another site's file, a run the lifetime budget cannot afford, or the
    same run with its tasks cut otherwise than when its records were first released."""


def config_digest(config: RunConfig) -> str:
    """The run's configuration apart from its schedule, hashed: the key of its entry in a ledger."""
    values = bare_config(config)
    values.pop("run_id")  # the same configuration under another id: the same mechanism on the same records
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def data_digest(config: RunConfig, train: str = "", index: int = 0) -> str:
    """What this client's records are: the bytes of its own training file (``train``; a folder: every file's
    relative path and bytes), or, on a shard of a common dataset, the dataset and the client's index (a shard of
    the same dataset under another partition shares records with this one: the same file)."""
    sha = hashlib.sha256()
    if train:
        root = Path(train)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for p in files:
            sha.update(str(p.relative_to(root) if root.is_dir() else p.name).encode() + b"\0")
            with p.open("rb") as f:
                while chunk := f.read(1 << 20):
                    sha.update(chunk)
        return "own-" + sha.hexdigest()
    sha.update(json.dumps({"dataset": config.dataset, "index": index}, sort_keys=True).encode())
    return "shard-" + sha.hexdigest()


def inputs_digest(plan: RoundPlan) -> str:
    """The digest of what ``plan`` asks a client to compute from: its task, classes, instruction and tensors (names,
    dtypes, shapes, bytes). Not its labels (phase, round, secure session, seed): the same inputs under another label
    give the same statistics."""
    sha = hashlib.sha256()
    head = [plan.task, list(plan.class_range), plan.seen_classes, plan.instruction.KIND, plan.instruction.to_json()]
    sha.update(json.dumps(head).encode())
    for name in sorted(plan.tensors):
        t = plan.tensors[name].detach().cpu().contiguous()
        sha.update(f"|{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        sha.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return sha.hexdigest()


@dataclass
class RunEntry:
    """One run's releases of this client's records: its id, budget, plan, each task's classes and counts."""

    run_id: str
    epsilon: float  # the run's budget (0: no budget, a secure run without differential privacy)
    delta: float
    mode: str
    grams: bool | None = None  # the plan's Gram releases, fixed at the first private step
    tasks: dict[int, str] = field(default_factory=dict)  # task -> its classes, as first released
    released: dict[int, tuple[int, int]] = field(default_factory=dict)  # task -> (rounds, Gram releases)
    unmasked: bool = False  # distributed mode: a sum holding this client's noise share may be out
    spent: float = 0.0  # the epsilon its most spent task's records have spent

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mode": self.mode,
            "grams": self.grams,
            "tasks": {str(t): c for t, c in sorted(self.tasks.items())},
            "released": {str(t): list(c) for t, c in sorted(self.released.items())},
            "unmasked": self.unmasked,
            "spent": self.spent,
        }

    @staticmethod
    def from_json(value: dict[str, Any]) -> RunEntry:
        return RunEntry(
            run_id=str(value["run_id"]),
            epsilon=float(value["epsilon"]),
            delta=float(value["delta"]),
            mode=str(value["mode"]),
            grams=None if value["grams"] is None else bool(value["grams"]),
            tasks={int(t): str(c) for t, c in value["tasks"].items()},
            released={int(t): (int(r), int(g)) for t, (r, g) in value["released"].items()},
            unmasked=bool(value["unmasked"]),
            spent=float(value["spent"]),
        )


def read_ledger(path: Path) -> dict[str, Any]:
    """A ledger file's JSON; ``LedgerRefused`` when it cannot be read or is of another version."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LedgerRefused(f"privacy ledger {path}: unreadable ({err}); it is this client's only account") from err
    if not isinstance(state, dict) or state.get("version") != VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise LedgerRefused(
            f"privacy ledger {path} is of version {version}, not {VERSION}: this client cannot read its account "
            "(an older client's file: keep it with that client, or let the site's operator reset it, lorm-ledger reset)"
        )
    return state


def ledger_path(data: str) -> Path:
    """Where a client keeps its privacy ledger unless told: ``$XDG_STATE_HOME/lorm/privacy/<data>.json`` (its own
    data's digest; on a shard of a common dataset, the dataset's and its index's), ``~/.local/state`` when unset."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "lorm" / "privacy" / f"{data[:40]}.json"
