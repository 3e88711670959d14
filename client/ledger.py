"""This client's own account of what its records have released in a privately trained run (``dp.mode = local``).

In local mode nobody is trusted with a client's records, the coordinator included, so the coordinator's ledger
(``server/strategies/private.py``) protects nobody from the coordinator. A hostile one could ask the same round
again and again, each answer carrying fresh noise, and average the noise away; or say a training round sends no
Grams (so the client calibrates its gradient noise for the whole budget) and then ask for a Gram step anyway. This
ledger is the client's defence, kept by the client alone:

- **a fixed plan.** The mechanism (``common.privacy.training.training_noise``) is pinned at the client's first private
  step, Grams or none, and every later step is noised by that plan, whatever its instruction says; a step asking
  for a Gram release the plan has no room for is refused.
- **a count.** Each step that releases something (a training round, a Gram release) is counted per task before its
  update leaves the client; a step beyond the plan (``BudgetExceeded``) is refused, and nothing is computed.
- **no fresh noise for the same step.** The same step asked again (a push lost to a coordinator's restart) gets
  the very update already sent: the same noisy message says nothing new, and costs nothing.
- **kept on disk** (``path``: the client's own file, written atomically before the update is returned), so that a
  client restarted by its operator cannot be asked again from zero. The update itself is not kept there: after a
  restart the same step asked again is a new release, counted as one.

Distributed mode (``dp.mode = distributed``, the closed-form heads under secure aggregation) has its own hole: each
secure session of a step masks the client's statistics with a fresh noise share, so a coordinator that unmasks a
session's sum and then claims it failed gets a second sum with independent noise, and averages the two. The ledger
records, before the client reveals anything, each step whose unmask request counted it among at least the
threshold's survivors (from then on the sum can be unmasked, with or without this client's answer); a later session
of that step gets nothing from it (:meth:`may_mask`: the client sits it out). A session that failed before its
unmask request spent nothing, and the client takes part in the next.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from common.infra.files import atomic_write_json
from common.methods import method
from common.privacy.ledger import BudgetExceeded
from common.privacy.training import TrainingLedger, TrainingNoise, releases, training_noise
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.messages import ClientUpdate, RoundPlan, TrainInstruction

log = logging.getLogger("lorm.client")

VERSION = 1


def step_of(plan: RoundPlan) -> tuple[int, int, str]:
    """The step ``plan`` asks for, whatever its secure session: (task, round, phase)."""
    return plan.task, plan.round, plan.phase.value


class ClientLedger:
    """The releases of this client's records in run ``config``: a ``dp_training`` method's in local mode (rounds and
    Gram releases against the plan), and in distributed mode the steps whose secure sum may be out."""

    def __init__(self, config: RunConfig, path: Path | None = None) -> None:
        self.config, self.path = config, path
        self.settings = config.section(DpSettings)
        self.grams: bool | None = None  # the plan's Gram releases, pinned at the first private step
        self.ledger: TrainingLedger | None = None
        self.last: tuple[tuple[int, int, str], ClientUpdate] | None = None  # the last step released, and its update
        self.unmasked: dict[tuple[int, int, str], int] = {}  # distributed: step -> the session whose sum may be out
        if path is not None and path.exists():
            self._load(path)

    @staticmethod
    def of(config: RunConfig, path: Path | None = None) -> ClientLedger | None:
        """The ledger of ``config``'s run when its method trains privately under a budget (local mode) or its clients
        add the noise shares (distributed mode), else ``None``."""
        dp = config.section(DpSettings)
        trained = dp.local and method(config.method).dp_training
        return ClientLedger(config, path) if trained or dp.distributed else None

    def noise(self, plan: RoundPlan) -> TrainingNoise:
        """The plan's mechanism, which noises every step of the run on this client: pinned at the first call (by
        ``plan``'s instruction: whether the method's rounds send Grams), the same at every later one."""
        if self.grams is None:
            step = plan.expect(TrainInstruction)
            self._pin(step.sends_grams)
        assert self.ledger is not None
        return self.ledger.noise

    def release(self, plan: RoundPlan, compute: Callable[[], ClientUpdate]) -> ClientUpdate:
        """``plan``'s update by ``compute``, within the plan: the update already sent when ``plan`` is the step last
        released; ``BudgetExceeded`` (nothing computed) when the step would take its task's records past the plan;
        otherwise computed, counted and written down before it is returned."""
        key = step_of(plan)
        if self.last is not None and self.last[0] == key:
            log.info("task %d round %d %s asked again: sending the update already sent (no new noise)", *key)
            return self.last[1]
        rounds, grams = releases(plan)
        if not rounds and not grams:
            return compute()
        noise = self.noise(plan)
        what = f"the coordinator's task {plan.task} {plan.phase.value} step {plan.round}"
        if grams and not noise.grams:
            raise BudgetExceeded(
                f"dp: {what} asks for a Gram release, but this client's plan, pinned at its first private step, "
                "has none (its noise was calibrated for training alone): refused"
            )
        assert self.ledger is not None
        self.ledger.check(plan.task, rounds, grams, what)
        update = compute()
        self.ledger.spend(plan.task, rounds, grams, what)
        self._save()
        self.last = (key, update)
        return update

    def may_mask(self, plan: RoundPlan) -> bool:
        """Whether this client may mask ``plan``'s statistics for its secure session: not when an earlier session of
        the same step reached an unmask request that counted it (its sum, with other noise, may be out)."""
        session = self.unmasked.get(step_of(plan))  # only distributed mode writes sessions down (unmasking)
        return session is None or session == plan.secure_attempt

    def unmasking(self, plan: RoundPlan) -> None:
        """``plan``'s session asks to unmask a sum that holds this client's noised statistics: written down before
        the client answers. Local mode records nothing: each of its updates is private on its own, and a new session
        masks the same noisy update again."""
        if not self.settings.distributed:
            return
        self.unmasked[step_of(plan)] = plan.secure_attempt
        self._save()

    def epsilon_spent(self) -> float:
        return self.ledger.epsilon_spent() if self.ledger is not None else 0.0

    # ---------------------------------------------------------------- on disk

    def _pin(self, grams: bool) -> None:
        cfg = self.config
        self.grams = grams
        self.ledger = TrainingLedger(
            self.settings, training_noise(self.settings, cfg.local_epochs, cfg.rounds_per_task, grams)
        )

    def _save(self) -> None:
        if self.path is None:
            return
        done = {str(task): list(counts) for task, counts in sorted(self.ledger.done.items())} if self.ledger else {}
        unmasked = [[*step, session] for step, session in sorted(self.unmasked.items())]
        atomic_write_json(
            self.path,
            {
                "version": VERSION,
                "run_id": self.config.run_id,
                "grams": self.grams,
                "released": done,
                "unmasked": unmasked,
            },
        )

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(path.read_text())
            run_id, grams, done = state["run_id"], state["grams"], state["released"]
            released = {int(task): (int(r), int(g)) for task, (r, g) in done.items()}
            unmasked = {(int(t), int(r), str(p)): int(a) for t, r, p, a in state.get("unmasked", [])}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"privacy ledger {path}: unreadable ({err}); it is this client's only account") from err
        if state.get("version") != VERSION or run_id != self.config.run_id:
            raise ValueError(
                f"privacy ledger {path} is run {run_id!r}'s (version {state.get('version')}), not run "
                f"{self.config.run_id!r}'s: give each run its own file"
            )
        self.unmasked = unmasked
        if grams is not None:
            self._pin(bool(grams))
            assert self.ledger is not None
            self.ledger.done = released
