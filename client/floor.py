"""The client's own floor under the coordinator's secure-aggregation and privacy settings.

Secure aggregation protects a client from the coordinator, so the coordinator cannot be the one
that decides whether it is on and how many clients must answer before a sum is unmasked. The
Join reply brings the run's configuration; before this client sends anything more (its model
description, a key, a share or an update), :func:`check_floor` holds that configuration to the
client's own flags and returns the parameters it accepted. Each check names the attack it stops:

- ``require_secure``: a coordinator that switches secure aggregation off reads every update in
  the clear.
- ``min_threshold``: with threshold ``t`` the coordinator unmasks a client's input from ``t`` of
  the shares it collects; ``t = 1`` lets it unmask any client alone. Default: a majority of the
  run's clients, ``n // 2 + 1``.
- ``min_clients``: a sum over few clients says much about each of them (of two, one client's
  input is the sum minus the other's; of one, the "sum" is the client's own input). With
  ``require_secure`` at least :data:`SECURE_MIN_CLIENTS`, and the threshold at least
  :data:`SECURE_MIN_THRESHOLD`, whatever the flags say lower: a secure run of one client is none.
- ``min_colluders``: distributed DP sizes each client's noise share so that the sum holds enough honest noise
  when ``dp.colluders`` clients collude with the coordinator; a coordinator that states fewer than the client
  fears leaves the sum with too little. A distributed run with ``dp.colluders`` below the client's
  ``--min-colluders`` is refused.

- ``max_epsilon`` (with ``max_delta``): differential privacy is a promise to the client only if the client's own
  noise keeps it. A coordinator could switch the budget off, raise it, keep the noise for itself (central mode: it
  adds the noise to the clients' un-noised sums), or choose the noise's seed (``dp.seed``: a seeded noise is known
  to whoever chose the seed, and can be subtracted). With ``--max-epsilon`` the client takes part only in a run
  whose budget is within its own, noised by the clients (``dp.mode`` local or distributed), from the CSPRNG.

- ``prior_digest``: a public prior shapes every record's features before the clip (``common/privacy/public_prior.py``).
  Any fixed map keeps the sensitivity, so no prior can cost this client its epsilon, but the coordinator chooses
  which prior a run names, and with it which directions of the features the head can read at all: a prior fitted on
  records that are not public, or one built to blind the head to some classes. With ``--public-prior-digest`` the
  client takes part only in a run that names the prior it has vetted (the digest ``lorm-prior`` prints); the plans'
  own copies are then held to that digest as to any run's (``client/features.py``).

Each secure-aggregation mode's least threshold is in :data:`MODE_FLOORS` (a mode this client does
not know is refused): a majority in the honest mode, ``2n/3 + 1`` in the signed mode.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from common.aggregation.declared import feature_stats_of
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings, is_sha256_hex
from common.secagg.graph import Parameters
from common.secagg.primitives import SecAggError
from common.secagg.rounds import default_threshold
from common.secagg.terms import sparse_parameters, threshold

ENV_REQUIRE = "LORM_REQUIRE_SECURE_AGGREGATION"
ENV_MAX_EPSILON = "LORM_MAX_EPSILON"
ENV_PRIOR_DIGEST = "LORM_PUBLIC_PRIOR_DIGEST"
HONEST = "honest"  # the mode of a run whose settings name none: a curious coordinator that follows the protocol
SECURE_MIN_CLIENTS = 3  # with --require-secure-aggregation: of two, one input is the sum minus the other
SECURE_MIN_THRESHOLD = 2  # with --require-secure-aggregation: one share never unmasks anything


class FloorError(ValueError):
    """The coordinator's configuration is below this client's floor; the message names the setting."""


@dataclass(frozen=True)
class Floor:
    """What this client accepts at least (its flags, never the coordinator's)."""

    require_secure: bool = False  # refuse a run without secure aggregation
    min_threshold: int = 0  # the least threshold accepted (0: a majority of the run's clients, n // 2 + 1)
    min_clients: int = 0  # the least number of clients in the run (0: 1, or SECURE_MIN_CLIENTS with require_secure)
    max_epsilon: float = math.inf  # the largest privacy budget accepted (inf: none required)
    max_delta: float = 1e-5  # with max_epsilon: the largest delta accepted
    min_colluders: int = 0  # distributed DP: the least dp.colluders the noise must be sized for
    prior_digest: str = ""  # the only public prior accepted, by its digest ("": any the run names, or none)

    def least_clients(self) -> int:
        least = self.min_clients or 1
        return max(least, SECURE_MIN_CLIENTS) if self.require_secure else least


@dataclass(frozen=True)
class Accepted:
    """The secure-aggregation parameters this client checked and will mask with."""

    enabled: bool
    threshold: int  # 0 when secure aggregation is off
    num_clients: int
    mode: str
    colluders: int = 0  # distributed DP: the colluders the noise is sized for
    epsilon: float = math.inf  # the run's privacy budget (inf: none)
    delta: float = 0.0
    dp_mode: str = ""

    def describe(self) -> str:
        """One line: the n, t, k and epsilon this client accepted."""
        secure = f"threshold t {self.threshold}, mode {self.mode}" if self.enabled else "secure aggregation off"
        privacy = (
            f"epsilon {self.epsilon:g}, delta {self.delta:g} ({self.dp_mode}), colluders k {self.colluders}"
            if math.isfinite(self.epsilon)
            else "no privacy budget"
        )
        return f"n {self.num_clients} clients, {secure}, {privacy}"


def majority(clients: int) -> int:
    return clients // 2 + 1


# Mode -> the least threshold this client accepts by default in a run of n clients (its --min-secagg-threshold
# replaces it).
MODE_FLOORS: dict[str, Callable[[int], int]] = {
    HONEST: majority,
    "signed": lambda clients: default_threshold(clients, signed=True),  # 2n/3 + 1: a coordinator that deviates
}


SPARSE_MIN_CORRUPT = 0.05  # the least share of colluding clients a sparse graph must be sized for, by this client
SPARSE_MIN_BITS = 40  # and the least failure exponent (2^-40)


def check_sparse(settings: SecAggSettings, params: Parameters) -> None:
    """:class:`FloorError` unless a sparse graph is sized for at least this client's floor: its neighbours and
    threshold are derived here (``common/secagg/graph.py``), from targets the coordinator's configuration states, so
    a coordinator that set them low would get small neighbourhoods that a few colluders fill."""
    if settings.corrupt < SPARSE_MIN_CORRUPT or settings.failure_bits < SPARSE_MIN_BITS:
        raise FloorError(
            f"the coordinator's configuration sizes its sparse graph ({params.k} neighbours, threshold {params.t}) "
            f"for secagg.corrupt={settings.corrupt:g} and secagg.failure_bits={settings.failure_bits}, below this "
            f"client's floor of {SPARSE_MIN_CORRUPT:g} and {SPARSE_MIN_BITS}: refusing neighbourhoods a few colluders "
            "could fill"
        )


def check_privacy(config: RunConfig, floor: Floor) -> None:
    """:class:`FloorError` unless the run's differential privacy meets ``floor.max_epsilon``: a budget within the
    client's, delta within ``floor.max_delta``, noise the clients add (``dp.mode`` local or distributed), drawn from
    the CSPRNG (``dp.seed = -1``). Nothing is required without ``max_epsilon``."""
    if math.isinf(floor.max_epsilon):
        return
    dp = config.section(DpSettings)
    mine = f"this client's --max-epsilon {floor.max_epsilon:g} (or ${ENV_MAX_EPSILON})"
    if not dp.enabled:
        raise FloorError(
            f"the coordinator's configuration sets no privacy budget (dp.epsilon unset), but {mine} requires one"
        )
    if dp.epsilon > floor.max_epsilon or dp.delta > floor.max_delta:
        raise FloorError(
            f"the coordinator's configuration sets dp.epsilon={dp.epsilon:g}, dp.delta={dp.delta:g}, above {mine} "
            f"with --max-delta {floor.max_delta:g}: refusing a weaker guarantee"
        )
    if not (dp.local or dp.distributed):
        raise FloorError(
            f"the coordinator's configuration sets dp.mode={dp.mode}: the coordinator would add the noise to this "
            f"client's un-noised statistics, so {mine} would rest on trusting it: refusing (local or distributed "
            "mode: the clients add the noise)"
        )
    if dp.seed >= 0:
        raise FloorError(
            f"the coordinator's configuration sets dp.seed={dp.seed}: the noise would come from a seed the coordinator "
            f"chose and can subtract, so {mine} would not hold: refusing (dp.seed -1: the noise from the CSPRNG)"
        )


def check_prior_pin(config: RunConfig, floor: Floor) -> None:
    """:class:`FloorError` unless the run's features pass the public prior ``floor.prior_digest`` (nothing is
    required without it)."""
    if not floor.prior_digest:
        return
    named = feature_stats_of(config).features.prior_digest
    if named != floor.prior_digest:
        said = f"names the public prior {named}" if named else "names no public prior"
        raise FloorError(
            f"the coordinator's configuration {said} (its method's prior_digest setting), but this client's "
            f"--public-prior-digest (or ${ENV_PRIOR_DIGEST}) is {floor.prior_digest}: refusing a prior it has not "
            "vetted"
        )


def check_floor(config: RunConfig, floor: Floor) -> Accepted:
    """The run's secure-aggregation parameters if they meet ``floor``, and its privacy budget
    (:func:`check_privacy`); else :class:`FloorError` naming the setting that failed, its value and this client's
    floor."""
    check_privacy(config, floor)
    check_prior_pin(config, floor)
    dp = config.section(DpSettings)
    if dp.distributed:
        if dp.colluders < floor.min_colluders:
            raise FloorError(
                f"the coordinator's configuration sets dp.colluders={dp.colluders}, below this client's "
                f"--min-colluders {floor.min_colluders}: its noise share would be sized for fewer colluding clients "
                "than this client allows for, and a sum would hold too little honest noise: refusing"
            )
    settings = config.section(SecAggSettings)
    n = config.num_clients
    least_clients = floor.least_clients()
    if n < least_clients:
        source = f"--min-clients {floor.min_clients}" if floor.min_clients >= least_clients else "a secure run's"
        raise FloorError(
            f"the coordinator's configuration sets num_clients={n}, below this client's floor of {least_clients} "
            f"({source}): refusing to take part"
        )
    mode = settings.mode
    if not settings.enabled:
        if floor.require_secure:
            raise FloorError(
                "the coordinator's configuration sets secagg.enabled=false, but this client requires secure "
                f"aggregation (--require-secure-aggregation or ${ENV_REQUIRE}): refusing to send updates in the clear"
            )
        return with_budget(Accepted(False, 0, n, mode), dp)
    try:
        t = threshold(settings, n)
    except SecAggError as err:
        raise FloorError(f"the coordinator's configuration is not a usable secure aggregation: {err}") from err
    if mode not in MODE_FLOORS:
        raise FloorError(
            f"the coordinator's configuration sets secagg.mode={mode!r}, which this client does not know "
            f"(it knows {sorted(MODE_FLOORS)}): refusing a protocol it cannot check"
        )
    sparse = sparse_parameters(settings, n)
    if sparse is not None:
        check_sparse(settings, sparse)
    least = floor.min_threshold or (sparse.t if sparse is not None else MODE_FLOORS[mode](n))
    if floor.require_secure:
        least = max(least, SECURE_MIN_THRESHOLD)
    if t < least:
        source = f"--min-secagg-threshold {floor.min_threshold}" if floor.min_threshold else f"mode {mode}'s for {n}"
        raise FloorError(
            f"the coordinator's configuration sets secagg.threshold={t} for num_clients={n}, below this client's "
            f"floor of {least} ({source}): with {t} shares the coordinator could unmask a single client's input"
        )
    return with_budget(Accepted(True, t, n, mode), dp)


def with_budget(accepted: Accepted, dp: DpSettings) -> Accepted:
    """``accepted`` with the run's privacy budget, and the colluders its distributed noise is sized for."""
    if not dp.enabled:
        return accepted
    colluders = dp.colluders if dp.distributed else 0
    return replace(accepted, epsilon=dp.epsilon, delta=dp.delta, dp_mode=dp.mode, colluders=colluders)


def pinned(config: RunConfig, accepted: Accepted) -> RunConfig:
    """``config`` with the checked threshold written out (no ``0: a majority`` left to recompute), so that
    what this client masks with is what it checked."""
    if not accepted.enabled:
        return config
    settings = {name: dict(values) for name, values in config.settings.items()}
    settings.setdefault(SecAggSettings.section, {})["threshold"] = accepted.threshold
    return config.replace(settings=settings)


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def add_floor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--require-secure-aggregation``, ``--min-secagg-threshold`` and ``--min-clients`` of ``lorm-client``."""
    g = parser.add_argument_group("this client's floor (it refuses a run below it before sending anything)")
    g.add_argument(
        "--require-secure-aggregation",
        action="store_true",
        default=_flag(os.environ.get(ENV_REQUIRE, "")),
        help=f"refuse a run without secure aggregation (default ${ENV_REQUIRE}=1 turns it on)",
    )
    g.add_argument(
        "--min-secagg-threshold",
        type=int,
        default=0,
        metavar="T",
        help="refuse a secure run whose threshold is below T (default: a majority of the run's clients, n // 2 + 1)",
    )
    g.add_argument(
        "--min-clients",
        type=int,
        default=0,
        metavar="N",
        help=f"refuse a run of fewer than N clients (default 1; with --require-secure-aggregation at least "
        f"{SECURE_MIN_CLIENTS}, and a threshold of at least {SECURE_MIN_THRESHOLD})",
    )
    g.add_argument(
        "--min-colluders",
        type=int,
        default=0,
        metavar="K",
        help="distributed DP: refuse a run whose noise is sized for fewer than K clients colluding with the "
        "coordinator (dp.colluders; default 0)",
    )
    g.add_argument(
        "--max-epsilon",
        type=float,
        default=float(os.environ.get(ENV_MAX_EPSILON) or math.inf),
        metavar="E",
        help="refuse a run unless it is differentially private at epsilon <= E, its noise added by the clients "
        f"(dp.mode local or distributed) from the CSPRNG (default ${ENV_MAX_EPSILON}; unset: no requirement)",
    )
    g.add_argument(
        "--max-delta",
        type=float,
        default=1e-5,
        metavar="D",
        help="with --max-epsilon: refuse a run whose dp.delta is above D (default 1e-5)",
    )
    g.add_argument(
        "--public-prior-digest",
        default=os.environ.get(ENV_PRIOR_DIGEST, ""),
        metavar="HEX",
        help="refuse a run unless its features pass this public prior (the digest lorm-prior prints; default "
        f"${ENV_PRIOR_DIGEST}; unset: any the run names, or none)",
    )


def floor_from_args(args: argparse.Namespace) -> Floor:
    if not (args.max_epsilon > 0 and 0 < args.max_delta < 1):
        raise FloorError(
            f"--max-epsilon must be > 0 and --max-delta in (0, 1), got {args.max_epsilon} and {args.max_delta}"
        )
    if args.min_secagg_threshold < 0 or args.min_clients < 0 or args.min_colluders < 0:
        raise FloorError(
            f"--min-secagg-threshold, --min-clients and --min-colluders must be >= 0, got "
            f"{args.min_secagg_threshold}, {args.min_clients} and {args.min_colluders}"
        )
    digest = args.public_prior_digest.strip().lower()
    if digest and not is_sha256_hex(digest):
        raise FloorError(f"--public-prior-digest must be 64 hex digits (lorm-prior prints it), got {digest[:80]!r}")
    return Floor(
        args.require_secure_aggregation,
        args.min_secagg_threshold,
        args.min_clients,
        args.max_epsilon,
        args.max_delta,
        args.min_colluders,
        digest,
    )
