"""Plug-in groups: the registries each role owns, found through entry points and checked as one.

The core names no plug-in. Each role declares a `PluginGroup` under the `splitleak.plugins`
entry-point group (pyproject.toml): it checks the config sections its plug-ins read, and says
which evaluation-only artifacts its configured plug-ins need the run to write. A package of
one's own can add a group the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from splitleak.registry import installed_entry_points

if TYPE_CHECKING:
    from splitleak.config import ExperimentConfig
    from splitleak.datasets import Schema

ENTRY_POINTS = "splitleak.plugins"

# Evaluation-only artifacts a plug-in may need the label party to write (never on the wire).
Artifact = Literal["clean_anchors"]


def _none(cfg: ExperimentConfig, schema: Schema) -> frozenset[Artifact]:
    return frozenset()


def _no_warnings(cfg: ExperimentConfig, schema: Schema) -> list[str]:
    return []


@dataclass(frozen=True)
class PluginGroup:
    """One role's plug-ins as validation sees them."""

    name: str  # the config sections it owns, in words (e.g. "objective and defense chain")
    # ConfigError naming the field when the group's plug-ins cannot run this config
    check: Callable[[ExperimentConfig, Schema], None]
    # the evaluation artifacts this config's plug-ins of the group read
    artifacts: Callable[[ExperimentConfig, Schema], frozenset[Artifact]] = _none
    # settings of the group's plug-ins that run, but probably not as meant (validate's warnings)
    warnings: Callable[[ExperimentConfig, Schema], list[str]] = _no_warnings


class PluginsMissing(RuntimeError):
    """The installed package's metadata lists no plug-in group (an install from before they
    existed, or a copy run without installing)."""


@functools.cache
def plugin_groups() -> tuple[PluginGroup, ...]:
    """Every registered group, loaded once per process, in name order."""
    found = installed_entry_points().get(ENTRY_POINTS, ())
    if not found:
        raise PluginsMissing(f"no '{ENTRY_POINTS}' entry points are installed: install the "
                             "package (make setup, or pip install -e .) so that its plug-in "
                             "groups are registered")
    return tuple(ep.load() for ep in found)
