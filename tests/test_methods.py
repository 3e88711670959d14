"""The method registry: every method has both halves, each resolvable by its own layer only."""

from types import ModuleType

import pytest

from client.methods import ClientMethod, client_method
from common.methods import LORA_ROUNDS, Method, load_half, method, registry, slice_methods
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, FeaturesStep, LoraStep, Mode, PromptStep
from common.wire.messages import Phase, RoundPlan
from server.strategies import STRATEGIES, Strategy


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_method_resolves_both_halves(name):
    entry = registry()[name]

    server, client = load_half(entry.server, "server"), client_method(RunConfig(method=name))

    assert issubclass(server, Strategy) and server.name == name and STRATEGIES[name] is server
    assert isinstance(client, ClientMethod)


def test_a_layer_loads_only_its_own_half():
    with pytest.raises(ValueError, match="inside package 'client'"):
        load_half(registry()["lorm"].server, "client")


def test_a_slice_registers_one_method_or_a_family():
    one, two = (
        Method(name, "server.x:X", "client.x:X", "help", steps=LORA_ROUNDS, aggregator="common.x:x")
        for name in ("a", "b")
    )
    slice_of = {"METHOD": one}, {"METHODS": (one, two)}
    wrong = {}, {"METHOD": (one,)}, {"METHODS": ()}, {"METHODS": [one]}, {"METHOD": one, "METHODS": (two,)}

    def module(**names: object) -> ModuleType:
        m = ModuleType("common.methods.x")
        m.__dict__.update(names)
        return m

    assert [slice_methods(module(**names)) for names in slice_of] == [(one,), (one, two)]
    for names in wrong:
        with pytest.raises(TypeError, match="slice common.methods.x must define METHOD"):
            slice_methods(module(**names))
    assert {m.name for m in registry().values() if m.settings is not None and m.settings.section == "ridge"} == {
        "ridge",
        "lorm-ridge",
        "lorm-ridge-first",
    }  # one slice, common/methods/closed_form.py, registers the closed-form heads


def test_unknown_method_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown method 'nope'; known: \[.*'lorm'"):
        method("nope")


@pytest.mark.parametrize(
    "name, served, refused",
    [
        ("lorm", Mode.LORA, Mode.FULL),
        ("fedavg", Mode.FULL, Mode.FEATURES),
        ("ridge", Mode.FEATURES, Mode.LORA),
        ("lorm-ridge", Mode.FEATURES, Mode.FULL),
    ],
)
def test_a_client_half_refuses_plans_of_another_mode(name, served, refused):
    half = client_method(RunConfig(method=name))
    steps = {Mode.LORA: LoraStep(), Mode.FULL: DenseStep(), Mode.FEATURES: FeaturesStep(), Mode.PROMPT: PromptStep()}

    def plan(mode: Mode) -> RoundPlan:
        return RoundPlan(
            run_id="r", phase=Phase.TRAIN, task=0, round=0, class_range=(0, 2), seen_classes=2, instruction=steps[mode]
        )

    assert half.serves(plan(served)).mode == served
    with pytest.raises(ValueError, match=f"this plan asks for '{refused.value}'"):
        half.serves(plan(refused))
