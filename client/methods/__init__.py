"""The client halves of the methods (``common.methods`` names the half of each method)."""

from __future__ import annotations

from client.methods.base import ClientMethod
from common.methods import load_half, method
from common.run.config import RunConfig


def client_method(config: RunConfig) -> ClientMethod:
    """The client half of the run's method (``config.method``), from the registry."""
    cls = load_half(method(config.method).client, "client")
    if not (isinstance(cls, type) and issubclass(cls, ClientMethod)):
        raise TypeError(f"method {config.method!r}: its client half {cls!r} is not a ClientMethod subclass")
    return cls()


__all__ = ["ClientMethod", "client_method"]
