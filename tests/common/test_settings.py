"""Typed settings: sections with defaults and help, dotted overrides that change one key, refusals that name it."""

import argparse
import json

import pytest

from common.methods.checks import unread_sections, validate
from common.methods.closed_form import NcmSettings, RidgeSettings
from common.methods.ties import TiesSettings
from common.run.arguments import add_config_arguments, config_from_args
from common.run.config import RunConfig
from common.run.settings import DataSettings, SecAggSettings
from engine.simulation import main as lorm_sim


def from_args(*argv: str) -> RunConfig:
    """The run of ``argv``'s flags, checked as a program checks it (against the registry too)."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return validate(config_from_args(parser.parse_args(list(argv))))


def test_a_dotted_override_changes_one_key_and_keeps_the_others():
    config = from_args(
        "--preset",
        "tiny",
        "--set",
        "method=ridge",
        "--set",
        "ridge.rp_dim=5000",
        "--set",
        "ridge.holdout=4",
        "--set",
        "data.synthetic_test=3",
    )

    assert config.section(RidgeSettings) == RidgeSettings(rp_dim=5000, holdout=4)  # the other keys: defaults
    assert config.section(DataSettings) == DataSettings(synthetic_classes=9, synthetic_train=40, synthetic_test=3)


def test_a_later_dotted_override_keeps_earlier_keys_of_its_section():
    config = from_args("--set", 'settings={"ties": {"density": 0.5, "scale": 0.7}}', "--set", "ties.scale=0.2")

    assert config.section(TiesSettings) == TiesSettings(density=0.5, scale=0.2)


def test_set_extra_merges_into_extra_instead_of_replacing_it(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"extra": {"synthetic_classes": 5, "synthetic_train": 7}}))

    config = from_args("--config", str(tmp_path / "c.json"), "--set", 'extra={"synthetic_test": 2}')

    assert config.section(DataSettings) == DataSettings(synthetic_classes=5, synthetic_train=7, synthetic_test=2)


def test_legacy_extra_keys_move_into_their_sections():
    built = RunConfig(method="ncm", extra={"rp_dim": 9, "ridge_lambda": 2.0, "ties_lambda": 0.1})
    assert built.extra == {"rp_dim": 9}  # its section is its method's: only the registry's check knows it

    config = validate(built)

    assert config.extra == {}
    assert config.settings == {"ncm": {"rp_dim": 9}, "ridge": {"fixed_lambda": 2.0}, "ties": {"scale": 0.1}}
    assert RunConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["ridge.rpdim=5"],
            r"unknown setting ridge\.rpdim; ridge has "
            r"\['activation', 'blocks', 'fixed_lambda', 'holdout', 'lambda_rule', 'lambdas', 'layers', 'norm', 'pool', "
            r"'prior_digest', 'prior_file', 'prior_k', 'rp_dim', 'views'\]",
        ),
        (
            ["nosuch.key=5"],
            r"unknown settings section 'nosuch'; known: "
            r"\['ccvr', 'coda', 'data', 'dp', 'ewc', 'fedproto', 'fedprox', 'ia3', 'l2p', 'lwf', 'model', 'ncm', "
            r"'pilora', 'ridge', 'robust', 'secagg', 'target', 'ties', 'vera'\]",
        ),
        (['ridge.rp_dim="wide"'], r"setting ridge\.rp_dim expects int, got str 'wide'"),
        (["ridge.rp_dim=1.5"], r"setting ridge\.rp_dim expects int, got float 1\.5"),
        (["ties.density=true"], r"setting ties\.density expects float, got bool True"),
        (['ridge.lambdas=[1, "x"]'], r"setting ridge\.lambdas\[1\] expects float, got str 'x'"),
        (['extra={"rp_dimm": 3}'], r"unknown extra key 'rp_dimm'"),
        (["ties.density=0"], r"setting ties\.density should lie in \(0, 1\], got 0\.0"),
        (["ridge.blocks=0", "ridge.rp_dim=8"], r"setting ridge\.blocks must be a positive integer \(1: one head\)"),
        (["ridge.blocks=2"], r"setting ridge\.blocks = 2 needs ridge\.rp_dim > 0"),
        (
            ["ridge.activation=sigmoid", "ridge.rp_dim=8"],
            r"ridge\.activation must be one of \['relu', 'gelu', 'tanh', ",
        ),
        (
            ["ncm.activation=tanh"],
            r"setting ncm\.activation applies to the random projection: it needs ncm\.rp_dim > 0",
        ),
        (["ridge.lambda_rule=mean"], r"setting ridge\.lambda_rule must be one of \['auto', 'members', 'average'\]"),
        # the run configuration's own fields, whatever a JSON file or --set holds
        (["train_dropout=yes"], r"train_dropout expects bool, got str 'yes'"),
        (["deterministic=1"], r"deterministic expects bool, got int 1"),
        (["num_clients=abc"], r"num_clients expects int, got str 'abc'"),
        (["rank=1.5"], r"rank expects int, got float 1\.5"),
        (["lr=true"], r"lr expects float, got bool True"),
        (["dataset=7"], r"dataset expects str, got int 7"),
        (['task_sizes=[30, "x"]'], r"task_sizes expects list\[int\], got list \[30, 'x'\]"),
    ],
)
def test_unknown_settings_and_wrong_types_are_refused_by_name(argv, message):
    with pytest.raises(ValueError, match=message):
        from_args(*[arg for item in argv for arg in ("--set", item)])


def test_a_float_setting_takes_an_integer():
    assert RunConfig(settings={"ties": {"scale": 1}}).section(TiesSettings).scale == 1.0
    assert RunConfig(lr=1, beta=2).lr == 1  # and a float field of the run configuration


def test_ridge_blocks_widen_the_head_to_the_members_projections_side_by_side():
    assert RidgeSettings(rp_dim=50, blocks=4).head_width(384) == 200
    assert RidgeSettings(rp_dim=50).head_width(384) == 50 and RidgeSettings().head_width(384) == 384


def test_ncm_and_ridge_read_their_own_rp_dim():
    config = RunConfig(method="lorm-ncm", settings={"ncm": {"rp_dim": 7}})

    assert config.section(NcmSettings).rp_dim == 7 and config.section(RidgeSettings).rp_dim == 0


def test_a_section_the_method_does_not_read_is_named_with_its_readers():
    lorm = RunConfig(settings={"ridge": {"rp_dim": 5000}, "data": {"train_val": True}, "dp": {}, "secagg": {}})
    assert unread_sections(lorm) == [
        "settings section 'ridge' is read by lorm-ridge, lorm-ridge-first, ridge, not by method 'lorm': it changes "
        "nothing in this run"
    ]
    assert unread_sections(RunConfig(method="lorm-ridge", settings={"ridge": {"rp_dim": 5000}})) == []
    assert unread_sections(RunConfig(method="ridge", settings={"ncm": {}, "ridge": {}}))[0].startswith(
        "settings section 'ncm' is read by lorm-ncm, ncm, not by method 'ridge'"
    )


def test_lorm_sim_warns_of_a_section_its_method_does_not_read_before_it_runs(tmp_path, capsys):
    argv = ["--set", "ccvr.epochs=2", "--set", "dataset=clinc150", "--set", f"data_dir={tmp_path}"]
    assert lorm_sim(argv) == 2  # no CLINC150 there: the run stops at its data, after the warning

    err = capsys.readouterr().err
    assert "lorm-sim: warning: settings section 'ccvr' is read by ccvr, not by method 'lorm'" in err


def test_lorm_server_warns_of_a_section_its_method_does_not_read_before_it_serves(tmp_path, capsys):
    from server.main import main as lorm_server

    config = tmp_path / "run.json"  # with a client's own file too: refused right after the warnings, nothing served
    config.write_text(json.dumps({"settings": {"ridge": {"rp_dim": 64}, "data": {"train_file": "x.csv"}}}))
    with pytest.raises(SystemExit):
        lorm_server(["--config", str(config), "--state-dir", str(tmp_path / "state"), "--insecure", "--port", "0"])

    out = capsys.readouterr()
    assert "settings section 'ridge' is read by lorm-ridge, lorm-ridge-first, ridge, not by method 'lorm'" in (
        out.out + out.err
    )


def test_describe_lists_a_methods_settings_with_defaults_and_help(capsys):
    assert lorm_sim(["--describe", "ridge"]) == 0

    out = capsys.readouterr().out
    assert "ridge.rp_dim (int, default 0): width F' of the random projection" in out
    assert "ridge.holdout (int, default 5)" in out and "client.methods.features:FeatureStatistics" in out


def test_help_lists_the_methods(capsys):
    with pytest.raises(SystemExit):
        lorm_sim(["--help"])

    assert "lorm-ridge-first" in capsys.readouterr().out


def test_lorm_sim_refuses_a_bad_setting_with_its_name_not_a_traceback(capsys):
    with pytest.raises(SystemExit):
        lorm_sim(["--set", "ridge.rp_dim=abc"])

    assert "setting ridge.rp_dim expects int, got str 'abc'" in capsys.readouterr().err


def test_a_secagg_threshold_of_half_the_clients_or_less_is_refused_unless_declared_unsafe():
    """With t <= n / 2 a minority of colluding shares unmasks one client's input."""
    with pytest.raises(ValueError, match=r"secagg.threshold=5 is at most half of num_clients=10.*unsafe_low_threshold"):
        from_args("--set", "num_clients=10", "--set", "secagg.enabled=true", "--set", "secagg.threshold=5")
    with pytest.raises(ValueError, match="secagg.threshold=1 is at most half of num_clients=3"):
        validate(RunConfig(num_clients=3, settings={"secagg": {"enabled": True, "threshold": 1}}))
    with pytest.raises(ValueError, match="secagg.threshold=4 exceeds num_clients=3"):
        validate(RunConfig(num_clients=3, settings={"secagg": {"enabled": True, "threshold": 4}}))
    assert RunConfig(num_clients=10, settings={"secagg": {"threshold": 6}}).section(SecAggSettings).threshold == 6
    assert RunConfig(num_clients=10, settings={"secagg": {"enabled": True}}).section(SecAggSettings).threshold == 0
    unsafe = RunConfig(num_clients=10, settings={"secagg": {"threshold": 5, "unsafe_low_threshold": True}})
    assert unsafe.section(SecAggSettings).threshold == 5


def test_the_earlier_name_of_method_is_still_read_and_never_written(tmp_path):
    """Configurations, result cells and state directories written before wire version 3 name the method
    ``strategy``: read as ``method`` from a dict, a --config file and --set; written as ``method`` only; both
    at once are refused."""
    old = RunConfig.from_dict({"strategy": "ridge", "seed": 3})
    assert old == RunConfig(method="ridge", seed=3)
    assert '"strategy"' not in old.to_json() and json.loads(old.to_json())["method"] == "ridge"
    with pytest.raises(ValueError, match="both 'method' and its earlier name 'strategy'"):
        RunConfig.from_dict({"strategy": "ridge", "method": "ncm"})
    file = tmp_path / "old.json"
    file.write_text(json.dumps({"strategy": "ncm"}))
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert config_from_args(parser.parse_args(["--config", str(file)])).method == "ncm"
    assert config_from_args(parser.parse_args(["--config", str(file), "--set", "method=ridge"])).method == "ridge"
    assert config_from_args(parser.parse_args(["--set", "strategy=lorm-ncm"])).method == "lorm-ncm"
