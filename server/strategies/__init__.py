"""Federated methods as siblings behind one interface (``base.Strategy``): the server halves.

The methods and their two halves are registered in ``common.methods`` (``registry()``); this module
resolves the server halves only.
"""

from __future__ import annotations

from common.methods import load_half, registry
from common.run.config import RunConfig
from common.wire.messages import ModelSpec
from server.strategies.base import Strategy


def _server_half(name: str) -> type[Strategy]:
    cls = load_half(registry()[name].server, "server")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)) or cls.name != name:
        raise TypeError(f"method {name!r}: its server half {cls!r} must be a Strategy subclass named {name!r}")
    return cls


STRATEGIES: dict[str, type[Strategy]] = {name: _server_half(name) for name in registry()}


def make_strategy(config: RunConfig, spec: ModelSpec) -> Strategy:
    if config.method not in STRATEGIES:
        raise ValueError(f"unknown method {config.method!r}; known: {sorted(STRATEGIES)}")
    return STRATEGIES[config.method](config, spec)


__all__ = ["Strategy", "STRATEGIES", "make_strategy"]
