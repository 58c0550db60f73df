"""Input-side protections a party applies to its own images before training (ALGORITHMS.md §5)."""

from __future__ import annotations

from pydantic import BaseModel

from splitleak.protection.antigan import AntiGanParams

# protection name -> its parameter model (the config's `[protection] params`)
PROTECTIONS: dict[str, type[BaseModel]] = {"antigan": AntiGanParams}

__all__ = ["PROTECTIONS", "AntiGanParams"]
