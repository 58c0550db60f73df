"""splitleak: vertical federated / split learning with every party a real gRPC service, and the
label leakage an attacker measures; `open_run` and `open_sweep` (splitleak.api) read what a run
or a sweep wrote, imported only when first used."""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "Sweep", "open_run", "open_sweep"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from splitleak import api

        return getattr(api, name)
    raise AttributeError(f"module 'splitleak' has no attribute {name!r}")
