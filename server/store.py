"""A run's state on disk (or in memory, for a run that keeps none): generations and staged submissions.

Layout of ``root``:

- ``CURRENT`` — the name of the newest complete generation (replaced atomically);
- ``gen-NNNNNN/meta.json`` and ``gen-NNNNNN/strategy.safetensors`` — the run's state after a
  step: a :class:`server.run_state.RunMeta` (step pointer, clients, metrics) and the strategy's tensors;
- ``staging/<step>/<index>.safetensors`` + ``<index>.json`` — every accepted submission of the
  coordinator's current step, written (and fsync'd) before the client is acknowledged; ``secagg.json``:
  the step's secure-aggregation session, when it has one;
- ``secagg-seen-keys.json`` — a fingerprint of every public key advertised in an earlier secure session of the
  run (:data:`SEEN_KEYS`), so that a replayed key is refused after a restart too.

A generation directory is complete before ``CURRENT`` names it, so a crash at any point
leaves either the old or the new generation in force; submissions of the step in progress
are re-folded from staging on restart.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor

from common.infra.faults import fault_point
from common.infra.files import atomic_write_bytes, atomic_write_json, fsync_dir
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, EvalReport, Phase
from server.run_state import RunMeta


def own_storage(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The tensors as safetensors writes them: each contiguous and alone in its storage. The strategy's
    tensors may share storage (a task's factors are the round's), or be views of a larger one: those are
    cloned; a tensor that already owns its storage whole is written as it is (a closed-form head's summed
    Grams are gigabytes, which a clone per commit would double)."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().cpu()
        storage = t.untyped_storage()
        whole = (
            t.is_contiguous()
            and t.data_ptr() == storage.data_ptr()
            and t.numel() * t.element_size() == storage.nbytes()
        )
        if not whole or storage.data_ptr() in seen or t.numel() == 0:
            t = t.clone().contiguous()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _save_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(own_storage(tensors), str(tmp))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_key(task: int, step: int) -> str:
    return f"t{task:04d}-s{step:03d}"


class Store:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ generations

    def _current(self) -> Path | None:
        current = self.root / "CURRENT"
        return self.root / current.read_text().strip() if current.exists() else None

    def latest_meta(self) -> dict | None:
        """The newest complete generation's ``meta.json`` alone (no tensors read), or ``None``."""
        gen = self._current()
        return None if gen is None else json.loads((gen / "meta.json").read_text())

    def latest(self) -> tuple[dict, dict[str, Tensor]] | None:
        """The newest complete generation ``(meta, strategy tensors)``, or ``None`` for a new run."""
        gen = self._current()
        if gen is None:
            return None
        meta = json.loads((gen / "meta.json").read_text())
        tensors_path = gen / "strategy.safetensors"
        tensors = load_file(str(tensors_path)) if tensors_path.exists() else {}
        return meta, tensors

    def latest_run(self, config: RunConfig) -> tuple[RunMeta, dict[str, Tensor]] | None:
        """The newest generation of the run of ``config`` (its meta read in any schema :class:`RunMeta`
        reads), or ``None`` for a new run; a run of another configuration here is refused."""
        saved = self.latest()
        if saved is None:
            return None
        raw, tensors = saved
        try:
            meta = RunMeta.from_json(raw)
        except ValueError as err:
            raise ValueError(f"state directory {self.root}: {err}") from err
        if meta.config != config:
            raise ValueError(
                f"state directory {self.root} holds run {meta.config.run_id!r} with a different "
                "configuration; use a fresh --state-dir or the same configuration"
            )
        return meta, tensors

    def commit(self, meta: dict, tensors: dict[str, Tensor]) -> None:
        """Write a new generation and make it current; then drop older generations."""
        existing = sorted(p.name for p in self.root.glob("gen-*") if p.is_dir())
        number = int(existing[-1].split("-")[1]) + 1 if existing else 0
        gen = self.root / f"gen-{number:06d}"
        if gen.exists():
            shutil.rmtree(gen)
        gen.mkdir()
        if tensors:
            _save_tensors(gen / "strategy.safetensors", tensors)
        fault_point("commit.tensors")
        atomic_write_json(gen / "meta.json", meta)
        fsync_dir(gen)
        atomic_write_bytes(self.root / "CURRENT", gen.name.encode())
        fault_point("commit.current")
        for name in existing:
            shutil.rmtree(self.root / name, ignore_errors=True)

    # ------------------------------------------------------------------ staging

    def _staging(self, key: str) -> Path:
        return self.root / "staging" / key

    def stage_update(self, key: str, update: ClientUpdate, idempotency_key: str) -> None:
        """Persist one accepted update of step ``key`` (durable before it is acknowledged)."""
        folder = self._staging(key)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = update.tensors
        i = update.client_index
        if tensors:
            _save_tensors(folder / f"{i}.safetensors", tensors)
        meta = {
            "idempotency_key": idempotency_key,
            "run_id": update.run_id,
            "client_id": update.client_id,
            "client_index": i,
            "task": update.task,
            "round": update.round,
            "phase": update.phase.value,
            "num_samples": update.num_samples,
            "train_loss": update.train_loss,
            "has_tensors": bool(tensors),
        }
        atomic_write_json(folder / f"{i}.json", meta)  # written last: its presence marks the update complete

    def staged_indices(self, key: str) -> list[int]:
        folder = self._staging(key)
        if not folder.exists():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def load_update(self, key: str, index: int) -> ClientUpdate:
        folder = self._staging(key)
        meta = json.loads((folder / f"{index}.json").read_text())
        tensors = load_file(str(folder / f"{index}.safetensors")) if meta["has_tensors"] else {}
        return ClientUpdate(
            tensors=tensors,
            run_id=meta["run_id"],
            client_id=meta["client_id"],
            client_index=index,
            task=meta["task"],
            round=meta["round"],
            phase=Phase(meta["phase"]),
            num_samples=meta["num_samples"],
            train_loss=float(meta["train_loss"]),
        )

    def drop_updates(self, key: str) -> None:
        """Delete step ``key``'s staged updates (a restarted secure session's abandoned masked inputs);
        each one's meta first, so that none is ever half there."""
        folder = self._staging(key)
        for index in self.staged_indices(key):
            (folder / f"{index}.json").unlink()
            (folder / f"{index}.safetensors").unlink(missing_ok=True)

    def save_secagg(self, key: str, state: dict) -> None:
        """Persist step ``key``'s secure-aggregation session (keys, sealed shares, rosters, unmask answers) whole,
        then empty its log of records (which the state holds already: a crash between replays them onto it,
        and each sets what it set before)."""
        folder = self._staging(key)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "secagg.json", state)
        (folder / SECAGG_LOG).unlink(missing_ok=True)

    def append_secagg(self, key: str, record: dict) -> None:
        """Append one client's record to step ``key``'s secure session (durable before the call returns): what a
        call adds costs its own bytes, not a rewrite of every client's."""
        folder = self._staging(key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / SECAGG_LOG, "ab") as log:
            log.write(json.dumps(record, sort_keys=True).encode() + b"\n")
            log.flush()
            os.fsync(log.fileno())

    def load_secagg(self, key: str) -> tuple[dict | None, list[dict]]:
        """Step ``key``'s saved session state and the records appended since (a torn last line, never
        acknowledged, is left out)."""
        folder = self._staging(key)
        path, log = folder / "secagg.json", folder / SECAGG_LOG
        state = json.loads(path.read_text()) if path.exists() else None
        records = []
        if log.exists():
            for line in log.read_bytes().split(b"\n"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    break  # the line a crash cut short: its call was never answered
        return state, records

    def stage_eval(self, key: str, report: EvalReport, idempotency_key: str) -> None:
        """Persist one accepted evaluation report of step ``key`` (durable before it is acknowledged)."""
        meta = {
            "idempotency_key": idempotency_key,
            "run_id": report.run_id,
            "client_id": report.client_id,
            "task": report.task,
            "correct": list(report.correct),
            "total": list(report.total),
        }
        atomic_write_json(self._staging(key) / f"{report.client_index}.json", meta)

    def load_eval(self, key: str, index: int) -> EvalReport:
        meta = json.loads((self._staging(key) / f"{index}.json").read_text())
        return EvalReport(meta["run_id"], meta["client_id"], index, meta["task"], meta["correct"], meta["total"])

    def drop_staging(self, keep: str | None = None) -> None:
        """Delete every staged step except ``keep`` (after a generation made them redundant)."""
        root = self.root / "staging"
        if not root.exists():
            return
        for folder in root.iterdir():
            if folder.name != keep:
                shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ the run's secure sessions

    def seen_keys(self) -> set[str]:
        """The fingerprints of every public key advertised in the run's earlier secure sessions."""
        path = self.root / SEEN_KEYS
        return set(json.loads(path.read_text())) if path.exists() else set()

    def add_seen_keys(self, fingerprints: set[str]) -> None:
        """Record ``fingerprints`` as seen (durable before the session that advertised them goes on)."""
        seen = self.seen_keys()
        if not fingerprints <= seen:
            atomic_write_json(self.root / SEEN_KEYS, sorted(seen | fingerprints))


class MemoryStore:
    """A run's state in memory, for a run that keeps none: the in-process engine without a state directory. The
    same calls as :class:`Store`, its staged submissions kept as they were staged (the in-process transport hands
    the coordinator its own copies); a commit keeps nothing, since nothing is ever resumed from here."""

    root = None

    def __init__(self) -> None:
        self._updates: dict[str, dict[int, ClientUpdate]] = {}
        self._reports: dict[str, dict[int, EvalReport]] = {}
        self._secagg: dict[str, str] = {}
        self._logs: dict[str, list[str]] = {}
        self._seen: set[str] = set()

    def latest_meta(self) -> dict | None:
        return None

    def latest_run(self, config: RunConfig) -> tuple[RunMeta, dict[str, Tensor]] | None:
        return None

    def commit(self, meta: dict, tensors: dict[str, Tensor]) -> None:
        """Nothing to keep: a run in memory is never resumed."""

    def stage_update(self, key: str, update: ClientUpdate, idempotency_key: str) -> None:
        self._updates.setdefault(key, {})[update.client_index] = update

    def staged_indices(self, key: str) -> list[int]:
        return sorted({*self._updates.get(key, {}), *self._reports.get(key, {})})

    def load_update(self, key: str, index: int) -> ClientUpdate:
        return self._updates[key][index]

    def drop_updates(self, key: str) -> None:
        self._updates.pop(key, None)

    def save_secagg(self, key: str, state: dict) -> None:
        self._secagg[key] = json.dumps(state)  # as written: what the session changes afterwards is not kept
        self._logs[key] = []

    def append_secagg(self, key: str, record: dict) -> None:
        self._logs.setdefault(key, []).append(json.dumps(record))

    def load_secagg(self, key: str) -> tuple[dict | None, list[dict]]:
        state = json.loads(self._secagg[key]) if key in self._secagg else None
        return state, [json.loads(r) for r in self._logs.get(key, [])]

    def stage_eval(self, key: str, report: EvalReport, idempotency_key: str) -> None:
        self._reports.setdefault(key, {})[report.client_index] = report

    def load_eval(self, key: str, index: int) -> EvalReport:
        return self._reports[key][index]

    def drop_staging(self, keep: str | None = None) -> None:
        for staged in (self._updates, self._reports, self._secagg, self._logs):
            for key in [k for k in staged if k != keep]:
                del staged[key]

    def seen_keys(self) -> set[str]:
        return set(self._seen)

    def add_seen_keys(self, fingerprints: set[str]) -> None:
        self._seen |= fingerprints


Storage = Store | MemoryStore  # where a coordinator keeps its run

SECAGG_LOG = "secagg.log"  # beside secagg.json: one JSON line per client's call since the state was last saved
SEEN_KEYS = "secagg-seen-keys.json"  # in the store's root: 16 bytes of each key's fingerprint, hex, one list
