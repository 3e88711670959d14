"""This client's own account of what its records have released, kept by the client alone and keyed to its data.

In local mode (``dp.mode = local``) nobody is trusted with a client's records, the coordinator included, so the
coordinator's ledger (``server/strategies/private.py``) protects nobody from the coordinator. This ledger is the
client's defence, and it counts by what the client computes, never by what a plan says about itself:

- **a release is what is read.** A step that trains (``TRAIN``) is a training round of its task's records, and a
  step whose instruction asks for any Gram is a Gram release, whatever its phase label
  (``common.privacy.training.releases``); a step of a kind the run's method never produces was refused before it
  got here (``client/plans.py``).
- **a fixed plan.** The mechanism (``common.privacy.training.training_noise``) follows the run's method: with Grams
  when the method has a Gram step (LoRM's family), else for training alone. A step asking for a Gram release the
  plan has no room for is refused.
- **a count.** Each release is counted per task before its update leaves the client; a release beyond the plan
  (``BudgetExceeded``) is refused, and nothing is computed.
- **nothing un-noised.** Before an update is returned, each of its tensors is held to what was counted: Grams only
  from a counted Gram release whose noise is not zero, trained weights only from a counted DP-SGD round, the head
  unchanged from the plan's otherwise, and nothing else at all (:func:`unnoised`).
- **no fresh noise for the same step.** The same step asked again (a push lost to a coordinator's restart) gets
  the very update already sent: the same noisy message says nothing new, and costs nothing.

Secure aggregation (any run with ``secagg.enabled``, and distributed mode's noise shares) has its own hole: a
coordinator that unmasks one session's sum and then runs the same step again (another session, a roster without a
victim, another round label) gets a second sum over the same inputs, and the difference of the two is one client's
input (or, under distributed DP, an average that halves the noise). The ledger writes down, before the client
reveals anything, the digest of each step's inputs (:func:`inputs_digest`: the plan's instruction, task, classes and
tensors, not its labels) whose unmask request counted it among at least the threshold's survivors; those inputs are
never masked again (:meth:`ClientLedger.may_mask`), in this run or any other on the same data, under any label. One
exception, outside distributed DP: the protocol's restart of the step just answered (its answers named a culprit, who
is left out) may mask them again, before the run moves on; in the signed mode only for a sum of the same survivors
less clients proven to deviate (:meth:`ClientLedger.restart_survivors`). A session that failed before its unmask
request spent nothing, and the client takes part in the next.

**Kept on disk, keyed to the data, across runs.** The file (``path``) belongs to this client's data (its digest,
:func:`data_digest`), not to a run id the coordinator chooses: each run is an entry keyed by the digest of its
configuration apart from its schedule (which grows while an open run lives), and a new run id does not start afresh.
A run whose budget, added to what other runs have already spent from the same records, exceeds the client's lifetime
budget (``--lifetime-epsilon``; by default the first private run's budget: the records take part in one private run)
is refused. Runs compose by adding their epsilons and deltas (basic composition: loose, never wrong). Only the site's
operator resets the account (``lorm-ledger reset``). The update itself is not kept: after a restart the same step
asked again is a new release, counted as one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from client.ledger_file import VERSION, LedgerRefused, RunEntry, config_digest, inputs_digest, read_ledger
from common.infra.files import atomic_write_json
from common.methods import method
from common.privacy.ledger import BudgetExceeded
from common.privacy.training import TrainingLedger, TrainingNoise, releases, training_noise
from common.run.config import RunConfig
from common.run.schedule import class_schedule
from common.run.settings import DpSettings, SecAggSettings
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import DELTA, FACTOR, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, parse_tensor_name

log = logging.getLogger("lorm.client")

MASKED_KEEP = 100_000  # input digests kept per file: far more steps than any run has, and a bounded file


def unnoised(update: ClientUpdate, plan: RoundPlan, rounds: int, grams: int, noise: TrainingNoise) -> list[str]:
    """The tensors of ``update`` that would leave a privately trained client without noise: a Gram without a counted
    Gram release of non-zero noise; trained weights without a counted DP-SGD round of non-zero noise; a head that
    differs from the plan's without one; any other kind (a Fisher, feature statistics), which local mode never
    noises."""
    trained = rounds > 0 and noise.noise_multiplier > 0
    bad = []
    for name, tensor in update.tensors.items():
        kind = parse_tensor_name(name)[0]
        if name == HEAD_GRAM or kind == GRAM:
            ok = grams > 0 and noise.gram_multiplier > 0
        elif name in (HEAD_WEIGHT, HEAD_BIAS):
            given = plan.get(name)
            ok = trained or (given is not None and torch.equal(given.to(tensor.dtype), tensor))
        elif kind in (FACTOR, DELTA):
            ok = trained
        else:
            ok = False
        if not ok:
            bad.append(name)
    return sorted(bad)


class ClientLedger:
    """The releases of this client's records: run ``config``'s entry (a ``dp_training`` method's rounds and Gram
    releases in local mode, in distributed mode whether a sum is out) and, for every secure run, the inputs whose
    secure sum may be out; ``path`` holds every run's on the same data (``data``: :func:`data_digest`)."""

    def __init__(self, config: RunConfig, path: Path | None = None, data: str = "") -> None:
        self.config, self.path, self.data = config, path, data
        self.settings = config.section(DpSettings)
        self.key = config_digest(config)
        budget = self.settings.epsilon if self.settings.enabled else 0.0
        self.entry = RunEntry(config.run_id, budget, self.settings.delta if budget else 0.0, self.settings.mode)
        self.others: dict[str, RunEntry] = {}  # the other runs on the same data
        self.masked: dict[str, list[Any]] = {}  # inputs digest -> [run key, task, round, phase, session, survivors]
        self.latest = ""  # the inputs digest written down last
        self.last: tuple[tuple[int, int, str], ClientUpdate] | None = None  # the last step released, and its update
        self.ledger: TrainingLedger | None = None  # the run's noise plan and its counts (the entry's), once pinned
        if path is not None and path.exists():
            self._load(path)
        if self.entry.grams is not None:
            self._pin(self.entry.grams)

    @staticmethod
    def of(config: RunConfig, path: Path | None = None, data: str = "") -> ClientLedger | None:
        """The ledger of ``config``'s run when its method trains privately under a budget (local mode), its clients
        add the noise shares (distributed mode), or it aggregates securely; else ``None``."""
        return ClientLedger(config, path, data) if ClientLedger.wanted(config) else None

    @staticmethod
    def wanted(config: RunConfig) -> bool:
        """Whether ``config``'s run has releases to account for on a client (:meth:`of`)."""
        dp = config.section(DpSettings)
        trained = dp.local and method(config.method).dp_training
        return trained or dp.distributed or config.section(SecAggSettings).enabled

    # ---------------------------------------------------------------- the run's admission

    def lifetime_spent(self) -> tuple[float, float]:
        """The epsilon and delta the other runs on these records have spent (basic composition: their sums)."""
        spent = [e for e in self.others.values() if e.spent > 0]
        return sum(e.spent for e in spent), sum(e.delta for e in spent)

    def admit(self, lifetime_epsilon: float | None = None) -> None:
        """``LedgerRefused`` unless this run's budget fits the records' lifetime budget beside what other runs on the
        same data have spent: ``lifetime_epsilon``, by default this run's own budget (so that records which took part
        in one private run take part in no second one until the site's operator says so)."""
        if not self.entry.epsilon:
            return
        others, others_delta = self.lifetime_spent()
        cap = self.entry.epsilon if lifetime_epsilon is None else lifetime_epsilon
        if others and others + self.entry.epsilon > cap * (1 + 1e-9):
            runs = sorted(e.run_id for e in self.others.values() if e.spent > 0)
            raise LedgerRefused(
                f"privacy ledger {self.path}: these records have spent epsilon {others:.4g} (delta {others_delta:.3g}) "
                f"in other runs ({', '.join(runs)}); this run's budget of {self.entry.epsilon:g} would take them to "
                f"{others + self.entry.epsilon:.4g}, over the lifetime budget of {cap:g} (--lifetime-epsilon; by "
                "default one run's budget). A new run id does not reset the account: only the site's operator can "
                "(lorm-ledger reset)"
            )

    # ---------------------------------------------------------------- local mode

    def noise(self, plan: RoundPlan) -> TrainingNoise:
        """The run's mechanism, which noises every step of the run on this client: fixed by the method (with Grams
        when it has a Gram step), the same at every call whatever a plan's instruction says."""
        if self.ledger is None:
            steps = method(self.config.method).steps
            self._pin(any(phase == "task_gram" for phase, _ in steps))
            self._save()
        assert self.ledger is not None
        return self.ledger.noise

    def release(self, plan: RoundPlan, compute: Callable[[], ClientUpdate], reads: str = "") -> ClientUpdate:
        """``plan``'s update by ``compute``, within the plan: the update already sent when ``plan`` is the step last
        released; ``BudgetExceeded`` (nothing computed) when the step would take its task's records past the plan,
        or its update would carry something un-noised; otherwise computed, counted and written down before it is
        returned. ``reads``: the classes of the task whose records the step reads (the worker's own cut)."""
        key = (plan.task, plan.round, plan.phase.value)
        if self.last is not None and self.last[0] == key:
            log.info("task %d round %d %s asked again: sending the update already sent (no new noise)", *key)
            return self.last[1]
        if not (self.settings.local and method(self.config.method).dp_training):
            return compute()
        rounds, grams = releases(plan)
        if not rounds and not grams:
            update = compute()
            self._refuse_unnoised(update, plan, 0, 0, self.noise(plan))
            return update
        noise = self.noise(plan)
        what = f"the coordinator's task {plan.task} {plan.phase.value} step {plan.round}"
        if grams and not noise.grams:
            raise BudgetExceeded(
                f"dp: {what} asks for a Gram release, but this client's plan for method {self.config.method} has "
                "none (its noise is calibrated for training alone): refused"
            )
        self._check_classes(plan.task, reads, what)
        assert self.ledger is not None
        self.ledger.check(plan.task, rounds, grams, what)
        update = compute()
        self._refuse_unnoised(update, plan, rounds, grams, noise)
        self.ledger.spend(plan.task, rounds, grams, what)  # the entry's counts: the ledger's own dict
        self.entry.spent = self.epsilon_spent()
        self._save()
        self.last = (key, update)
        return update

    def _refuse_unnoised(
        self, update: ClientUpdate, plan: RoundPlan, rounds: int, grams: int, noise: TrainingNoise
    ) -> None:
        bad = unnoised(update, plan, rounds, grams, noise)
        if bad:
            raise BudgetExceeded(
                f"dp: the update of the coordinator's task {plan.task} {plan.phase.value} step {plan.round} would "
                f"carry {', '.join(bad)} without noise ({rounds} training rounds and {grams} Gram releases counted): "
                "refused"
            )

    def _check_classes(self, task: int, reads: str, what: str) -> None:
        tasks = self.entry.tasks
        if task in tasks and reads and tasks[task] != reads:
            raise LedgerRefused(
                f"dp: {what}: this run's task {task} now holds other classes ({reads:.200}) than when its records were "
                f"first released ({tasks[task]:.200}); their releases would be counted against the wrong records: "
                "refused"
            )
        if reads:
            tasks.setdefault(task, reads)

    def epsilon_spent(self, task: int | None = None) -> float:
        """The epsilon task ``task``'s records have spent in this run; ``None``: the most any task's have."""
        if self.settings.distributed:
            return self.entry.epsilon if self.entry.unmasked else 0.0
        return self.ledger.epsilon_spent(task) if self.ledger is not None else 0.0

    # ---------------------------------------------------------------- secure aggregation

    def may_mask(self, plan: RoundPlan) -> bool:
        """Whether this client may mask ``plan``'s inputs for its secure session: not when a session of any step, in
        any run on these records, with the same inputs reached an unmask request that counted this client (its
        sum may be out). The very session written down may go on (a retried answer). A later session of the very
        step written down last (the protocol's restart after answers that named a culprit, who is left out) may mask
        them again: in the honest mode, where the complaint round keeps the culprit from being an honest client; in
        the signed mode, where a coordinator that deviates could name anyone, only for a sum it may unmask without
        clients proven to deviate and nobody else (:meth:`restart_survivors`, checked before the client reveals
        anything). Never under distributed DP (a fresh noise share would average the first one's down)."""
        digest = inputs_digest(plan)
        seen = self.masked.get(digest)
        if seen is None or seen[:5] == self._session(plan):
            return True
        return self._restart(plan, digest, seen) and not self.settings.distributed

    def restart_survivors(self, plan: RoundPlan) -> list[int] | None:
        """Signed mode: when ``plan`` restarts the step whose unmask request this client answered last, the survivors
        of that request: the restart's sum may leave out only clients proven to deviate from it (``client/secure.py``),
        or the difference of the two sums would be the input of an honest client the coordinator left out. ``None``
        otherwise (the client's first session over these inputs: nothing to difference)."""
        digest = inputs_digest(plan)
        seen = self.masked.get(digest)
        if seen is None or seen[:5] == self._session(plan) or not self._restart(plan, digest, seen):
            return None
        if self.config.section(SecAggSettings).mode != "signed":
            return None
        return [int(i) for i in seen[5]] if len(seen) > 5 else []

    def _restart(self, plan: RoundPlan, digest: str, seen: list[Any]) -> bool:
        return seen[:4] == self._session(plan)[:4] and plan.secure_attempt > seen[4] and digest == self.latest

    def unmasking(self, plan: RoundPlan, survivors: list[int] | None = None) -> None:
        """``plan``'s session asks to unmask a sum of ``survivors``' inputs, this client's among them: written down
        before the client answers."""
        self.latest = inputs_digest(plan)
        self.masked[self.latest] = [*self._session(plan), sorted(survivors or [])]
        if self.settings.distributed:
            self.entry.unmasked = True
            self.entry.spent = self.epsilon_spent()
        self._save()

    def _session(self, plan: RoundPlan) -> list[Any]:
        return [self.key, plan.task, plan.round, plan.phase.value, plan.secure_attempt]

    # ---------------------------------------------------------------- on disk

    def _pin(self, grams: bool) -> None:
        cfg = self.config
        self.entry.grams = grams
        noise = training_noise(self.settings, cfg.local_epochs, cfg.rounds_per_task, grams)
        self.ledger = TrainingLedger(self.settings, noise)
        self.ledger.done = self.entry.released  # one dict: what the ledger counts is what the entry keeps

    def state(self) -> dict[str, Any]:
        masked = sorted(self.masked.items(), key=lambda item: item[0])[-MASKED_KEEP:]
        return {
            "version": VERSION,
            "data": self.data,
            "runs": {key: entry.to_json() for key, entry in sorted((self.others | {self.key: self.entry}).items())},
            "masked": [[digest, *session] for digest, session in masked],
            "latest": self.latest,
        }

    def _save(self) -> None:
        if self.path is not None:
            atomic_write_json(self.path, self.state())

    def _load(self, path: Path) -> None:
        state = read_ledger(path)
        if state.get("data") != self.data:
            raise LedgerRefused(
                f"privacy ledger {path} is the account of other data ({str(state.get('data'))[:24]}…), not of this "
                f"client's ({self.data[:24]}…): give each site's data its own file"
            )
        try:
            runs = {str(k): RunEntry.from_json(v) for k, v in state["runs"].items()}
            self.masked = {str(d): list(rest) for d, *rest in state["masked"]}
            self.latest = str(state.get("latest", ""))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise LedgerRefused(f"privacy ledger {path}: unreadable ({err}); it is this client's only account") from err
        mine = runs.pop(self.key, None)
        if mine is not None:
            mine.run_id = self.config.run_id  # the same configuration: the same run, whatever its id
            self.entry = mine
        self.others = runs


def task_classes(config: RunConfig, task: int, class_range: tuple[int, int]) -> str:
    """Task ``task``'s classes as the client cuts them: their names when the run names them, else the head rows
    under the run's class order."""
    schedule = class_schedule(config)
    if schedule is not None and task < len(schedule):
        return ",".join(schedule[task])
    lo, hi = class_range
    return f"{config.class_order}:{lo}-{hi}"


def budget_line(ledger: ClientLedger) -> str:
    """What the ledger holds for the log: this run's epsilon spent and the other runs'."""
    others, _ = ledger.lifetime_spent()
    return (
        f"epsilon {ledger.epsilon_spent():.4g} spent in this run, {others:.4g} in {len(ledger.others)} other runs on "
        "the same data"
    )
