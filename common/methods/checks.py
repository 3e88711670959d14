"""A run's configuration checked against the methods' registry: what ``RunConfig`` cannot check alone.

``RunConfig`` (``common/run/config.py``) checks its own fields when it is built; what depends on the registry of
this package is checked here, by :func:`validate`: every settings section a run sets, parsed by its class (each
method's slice holds its own), the legacy ``extra.rp_dim`` placed in its method's section, the clients' own data
against what the run's method can take, and a privacy budget against what the method reads and releases. Whoever
builds a configuration from what an operator or a peer gave calls it: the programs' flags (``lorm-server``,
``lorm-sim``, ``lorm-launch``, ``lorm-bench``, the client's ``--model-spec``), the coordinator and the in-process
engine, a client at Join, an exported model's card. :func:`unread_sections` names the sections a run sets that
its method does not read (the coordinator's warning, not a refusal).
"""

from __future__ import annotations

import dataclasses

from common.methods import Method, registry, sections
from common.run.config import CLASSES_FROM_SETTING, LEGACY_BY_METHOD, RunConfig
from common.run.settings import LEGACY_EXTRA, DataSettings, DpSettings, RobustSettings, SecAggSettings
from common.secagg.terms import threshold


def validate(config: RunConfig) -> RunConfig:
    """``config``, its legacy ``extra.rp_dim`` moved into its method's section, once every check of its settings
    against the registry passes; ``ValueError`` naming every problem found otherwise."""
    problems = _settings_problems(config)
    if problems:
        raise ValueError("invalid run configuration: " + "; ".join(problems))
    return config


def _settings_problems(config: RunConfig) -> list[str]:
    """Place the legacy ``extra`` key ``RunConfig`` leaves to the registry, then parse every section (the problems
    found)."""
    own = registry()[config.method].settings if config.method in registry() else None
    for key, value in config.extra.items():  # only LEGACY_BY_METHOD: RunConfig moved the others
        section, name = LEGACY_EXTRA[key]
        if key == LEGACY_BY_METHOD and own is not None and key in {f.name for f in dataclasses.fields(own)}:
            section = own.section  # ncm's rp_dim as well as ridge's
        config.settings.setdefault(section, {})[name] = value
    config.extra = {}
    problems = []
    for name, values in config.settings.items():
        if name not in sections():
            problems.append(f"unknown settings section {name!r}; known: {sorted(sections())}")
            continue
        try:
            sections()[name].parse(values)
        except ValueError as err:
            problems.append(str(err))
    if not problems:  # a threshold is safe or not only against the run's number of clients
        try:
            config.section(SecAggSettings).check_clients(config.num_clients)
        except ValueError as err:
            problems.append(str(err))
    if not problems:
        problems += _owned_problems(config)
    if not problems:
        problems += _private_problems(config)
    return problems


def _client_level_problems(config: RunConfig, known: Method | None) -> list[str]:
    """``dp.mode = client`` (DP-FedAvg): a plain-averaging method, the coordinator seeing each update (it clips
    them), a schedule fixed at the start (the budget is composed over its rounds), nothing else released."""
    if known is None or not known.dp_client_level:
        able = sorted(m.name for m in registry().values() if m.dp_client_level)
        return [f"dp.mode = client: client-level DP covers the plain-averaging methods {able}, not {config.method!r}"]
    if config.section(SecAggSettings).enabled:
        return [
            "dp.mode = client: the coordinator clips each client's change, so it must see the updates, which "
            "secure aggregation hides from it: set secagg.enabled=false, or dp.mode = local"
        ]
    if config.section(RobustSettings).enabled:
        return [
            "dp.mode = client with robust.enabled: the screening drops or scales updates by what the others "
            "sent, which the clipping's bound does not cover: the clip is the bound on a client's weight"
        ]
    if config.section(DataSettings).open:
        return [
            "dp.mode = client with data.open: the budget is composed over every round of the run, so its "
            "schedule must be fixed at the start"
        ]
    if config.section(DataSettings).validation:
        return ["dp.mode = client with data.validation: the validation accuracy would be released un-noised"]
    return []


def _private_problems(config: RunConfig) -> list[str]:
    """A run with a privacy budget (``dp.epsilon``) reads its training records only where the noise covers
    them: a method whose slice says so (``Method.private``), and no evaluation on held-back training records."""
    dp = config.section(DpSettings)
    if not dp.enabled:
        return []
    if dp.distributed and not config.section(SecAggSettings).enabled:
        return [
            "dp.mode = distributed: the clients' noise shares hide each other only inside a securely aggregated "
            "sum; without it the coordinator would see each client's statistics with a fraction of the noise. "
            "Set secagg.enabled=true, or dp.mode = central"
        ]
    if config.section(RobustSettings).enabled and dp.mode == "central":
        return [
            "dp.mode = central with robust.enabled: the screening drops or scales a client's un-noised statistics "
            "by the other clients' (one record can flip a whole client's verdict, which the clip does not bound) "
            "and its report of them is released un-noised: turn one of them off (local mode screens noised "
            "updates, which is post-processing)"
        ]
    if dp.colluders and not dp.distributed:
        return [
            f"dp.colluders={dp.colluders}: colluding clients matter only to the clients' noise shares of "
            f"dp.mode = distributed, not to dp.mode = {dp.mode}"
        ]
    if dp.distributed:
        try:
            t = threshold(config.section(SecAggSettings), config.num_clients)
        except ValueError as err:
            return [str(err)]
        if dp.colluders >= t:
            return [
                f"dp.colluders={dp.colluders} must be below the secure aggregation threshold {t} of "
                f"num_clients={config.num_clients}: {dp.colluders} colluders' shares are known to the coordinator, "
                "and a sum of t survivors needs an honest share to carry any noise"
            ]
    known = registry().get(config.method)
    if dp.mode == "client":
        return _client_level_problems(config, known)
    if known is not None and known.dp_training and dp.mode != "local":
        either = " (record-level) or dp.mode=client (client-level, DP-FedAvg)" if known.dp_client_level else ""
        return [
            f"dp.epsilon: method {config.method!r} trains on its clients' records, and each client noises what it "
            f"trains and sends itself (DP-SGD): set dp.mode=local{either} (not {dp.mode!r})"
        ]
    if known is not None and known.private and dp.mode == "local":
        return [
            f"dp.mode = local: method {config.method!r} releases summed statistics, noised by the coordinator "
            "(central) or by the clients' shares under secure aggregation (distributed), not by each client alone"
        ]
    if known is not None and not (known.private or known.dp_training):
        private = sorted(m.name for m in registry().values() if m.private or m.dp_training)
        return [
            f"dp.epsilon: method {config.method!r} reads training records outside the noised statistics (its "
            f"training or its other steps): differential privacy covers only {private}"
        ]
    if config.section(DataSettings).validation:
        return [
            "dp.epsilon with data.validation: the validation samples are training records whose accuracy "
            "would be released un-noised; evaluate on the test split (data.validation=0)"
        ]
    return []


def _owned_problems(config: RunConfig) -> list[str]:
    """A run on the clients' own data names its classes (they label the data by name)."""
    data = config.section(DataSettings)
    if data.clients_dir and not data.owned:
        return ["data.clients_dir is the clients' own data: set data.owned=true too"]
    if data.owned and (config.dataset not in CLASSES_FROM_SETTING or not data.classes):
        return [
            "data.owned: the clients' own data is labelled by class name, so the configuration names the run's "
            f"classes in task order: data.classes, with dataset one of {list(CLASSES_FROM_SETTING)} "
            f"(got dataset {config.dataset!r}, {len(data.classes)} classes)"
        ]
    if (data.open or data.max_classes) and not data.owned:
        return ["data.open and data.max_classes are settings of a run on the clients' own data: set data.owned"]
    if data.owned and config.dataset == "textfile" and config.max_length == 0:
        # each client would count it from its own sentences: their models would differ, and the export's
        # tokenization would be no client's in particular
        return [
            "data.owned with max_length 0: each client would count the tokens a sentence keeps from its own "
            "data, and the clients' models would differ; set max_length to the largest of the sites' counts "
            "(--set max_length=N; each site's: lorm-sim --count-tokens ITS_TRAINING_FILE with the run's "
            "--preset and backbone)"
        ]
    if data.open:
        if config.method in registry() and not registry()[config.method].open_schedule:
            return [f"data.open: method {config.method!r} sizes its state by the tasks it starts with: none later"]
    if data.max_classes and data.max_classes < len(data.classes):
        return [
            f"data.max_classes={data.max_classes} is the head's rows, fewer than the {len(data.classes)} classes "
            "of data.classes: raise it, or 0 for exactly those classes"
        ]
    return []


def unread_sections(config: RunConfig) -> list[str]:
    """A warning for each settings section this run sets that its method does not read (another method's),
    naming the methods that do: such a section changes nothing, and whoever set it most likely meant another
    method. Not an error: a grid sets one section for all its methods, and a state directory or a cell written
    so must still load."""
    own = registry()[config.method].settings
    warnings = []
    for name in sorted(config.settings):
        readers = sorted(m.name for m in registry().values() if m.settings is not None and m.settings.section == name)
        if not readers or (own is not None and name == own.section):  # every run's section, or its own
            continue
        warnings.append(
            f"settings section {name!r} is read by {', '.join(readers)}, not by method {config.method!r}: "
            f"it changes nothing in this run"
        )
    return warnings
