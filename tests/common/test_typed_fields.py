"""The one parser of the dataclasses that travel as JSON (settings sections, instructions): a value is taken
only when it is of its field's kind, and a refusal names the field, what it expects and what came."""

from dataclasses import dataclass, field
from enum import Enum

import pytest

from common.typed.fields import coerce, parse_fields


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Example:
    flag: bool = False
    count: int = 1
    rate: float = 0.5
    name: str = ""
    colour: Colour = Colour.RED
    rates: tuple[float, ...] = ()
    names: list[str] = field(default_factory=list)


def parse(values: dict, finite: bool = True) -> Example:
    return parse_fields(Example, values, "example", lambda key: f"field example.{key}", finite=finite)


def test_values_of_their_fields_kinds_are_taken_and_the_rest_keep_their_defaults():
    got = parse({"flag": True, "count": 3, "rate": 2, "colour": "blue", "rates": [1, 2.5], "names": ("a",)})

    assert got == Example(flag=True, count=3, rate=2.0, colour=Colour.BLUE, rates=(1.0, 2.5), names=["a"])
    assert type(got.rate) is float and got.colour is Colour.BLUE and type(got.rates[0]) is float
    assert parse({}) == Example()


@pytest.mark.parametrize(
    "values, message",
    [
        ({"cnt": 1}, r"unknown field example\.cnt; example has \['colour', 'count', 'flag', "),
        ({"count": True}, r"field example\.count expects int, got bool True"),  # a bool is never a number
        ({"rate": False}, r"field example\.rate expects float, got bool False"),
        ({"count": 1.0}, r"field example\.count expects int, got float 1\.0"),
        ({"flag": 1}, r"field example\.flag expects bool, got int 1"),
        ({"name": 7}, r"field example\.name expects str, got int 7"),
        ({"colour": "green"}, r"field example\.colour expects one of \['red', 'blue'\], got 'green'"),
        ({"rates": 1.0}, r"field example\.rates expects tuple\[float, \.\.\.\], got float 1\.0"),
        ({"rates": [1.0, "x"]}, r"field example\.rates\[1\] expects float, got str 'x'"),
        ({"rate": float("nan")}, r"field example\.rate expects a finite number, got nan"),
        ({"rates": [float("inf")]}, r"field example\.rates\[0\] expects a finite number, got inf"),
    ],
)
def test_a_value_of_another_kind_is_refused_naming_the_field_what_it_expects_and_what_came(values, message):
    with pytest.raises(ValueError, match=message):
        parse(values)


def test_finiteness_may_be_left_to_the_class():
    assert parse({"rate": float("inf")}, finite=False).rate == float("inf")
    with pytest.raises(ValueError, match="expects float"):
        coerce("x", float, "inf", finite=False)  # still a number
