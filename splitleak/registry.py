"""A named plug-in registry that refuses duplicates and lists valid names in its errors.

Built-in plug-ins register themselves by name when their package is imported. A package of
one's own adds plug-ins through the entry-point group `splitleak.<kind>s` (`splitleak.attacks`,
`splitleak.defenses`, `splitleak.objectives`, `splitleak.datasets`, `splitleak.protections`):
each entry point names one plug-in class, under the name it is used by in a config. They are
loaded on the registry's first lookup, in every process that looks (each role's included); the
installed distributions are scanned once per process, for every registry and plug-in group.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from splitleak.config import ConfigError

T = TypeVar("T")


class UnknownPluginError(KeyError):
    """Raised for a name that no plug-in is registered under."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class PluginLoadError(ConfigError):
    """An installed plug-in that cannot be used: its import fails, its name is taken, or it
    lacks what its kind requires. The message names the entry point and its package; a
    ConfigError, so that every CLI stops with the sentence before any process starts."""


@functools.cache
def installed_entry_points() -> dict[str, tuple[EntryPoint, ...]]:
    """Every installed entry point by group, each group in name order: one scan of the
    installed distributions per process, shared by every group that looks."""
    found = entry_points()
    return {group: tuple(sorted(found.select(group=group), key=lambda ep: ep.name))
            for group in found.groups}


def describe_entry_point(kind: str, ep: EntryPoint) -> str:
    """`dataset 'blobs' (splitleak.datasets entry point 'mydata:Blobs' of package 'mydata')`."""
    package = f" of package {ep.dist.name!r}" if ep.dist is not None else ""
    return f"{kind} {ep.name!r} ({ep.group} entry point {ep.value!r}{package})"


class Registry(Generic[T]):
    """Maps a name to a plug-in (a class or a factory) of one kind."""

    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base  # what an installed package's plug-in of this kind must subclass
        self.entry_point_group = f"splitleak.{kind}s"
        self._entries: dict[str, T] = {}
        self._installed: set[str] = set()  # names an installed package's entry point added
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        self._load_installed()
        try:
            return self._entries[name]
        except KeyError:
            near = difflib.get_close_matches(str(name), self.names(), n=1, cutoff=0.6)
            guess = f" (did you mean {near[0]!r}?)" if near else ""
            raise UnknownPluginError(
                f"unknown {self.kind} {name!r}{guess}; allowed: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        self._load_installed()
        return sorted(self._entries)

    def built_in_names(self) -> list[str]:
        """The names of this project's own plug-ins, without any installed package's."""
        return [name for name in self.names() if name not in self._installed]

    def __contains__(self, name: object) -> bool:
        self._load_installed()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _load_installed(self) -> None:
        """Register the plug-ins installed packages declare under `entry_point_group`, once."""
        if self._loaded:
            return
        self._loaded = True  # first, so that a plug-in's own lookups during import do not recurse
        for ep in installed_entry_points().get(self.entry_point_group, ()):
            self._add_installed(ep)

    def _add_installed(self, ep: EntryPoint) -> None:
        where = describe_entry_point(self.kind, ep)
        if ep.name in self._entries:  # a built-in, or another package's, under the same name
            raise PluginLoadError(f"{where}: the name {ep.name!r} is already taken by "
                                  f"{_qualname(self._entries[ep.name])}; register it under another name")
        try:
            entry = ep.load()
        except Exception as err:
            raise PluginLoadError(f"{where} cannot be imported: {type(err).__name__}: {err}") from err
        if ep.name in self._entries and self._entries[ep.name] is not entry:
            raise PluginLoadError(f"{where}: importing it registered another {self.kind} under "
                                  f"{ep.name!r} ({_qualname(self._entries[ep.name])})")
        problem = _incomplete(entry, ep.name, self.base)
        if problem:
            raise PluginLoadError(f"{where}: {problem}")
        self._entries[ep.name] = entry
        self._installed.add(ep.name)


def _qualname(entry: Any) -> str:
    return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', repr(entry))}"


def _incomplete(entry: Any, name: str, base: type | None) -> str | None:
    """What a plug-in class lacks: its kind's base class, abstract methods left unimplemented,
    class attributes its base declares (`ClassVar` without a value) left unset, or a `name`
    other than its entry point's. None when complete."""
    if not inspect.isclass(entry):
        return f"{entry!r} is not a class"
    if base is not None and not issubclass(entry, base):
        return (f"{entry.__qualname__} does not subclass {_qualname(base)}, the interface every "
                "plug-in of its kind implements")
    params, root = getattr(entry, "Params", None), getattr(base, "Params", None)
    if inspect.isclass(root) and not (inspect.isclass(params) and issubclass(params, root)):
        return (f"{entry.__qualname__}.Params is {params!r}; it must be a subclass of "
                f"{_qualname(root)} (a pydantic model of its parameters)")
    if inspect.isabstract(entry):
        missing = ", ".join(sorted(getattr(entry, "__abstractmethods__", ())))
        return f"{entry.__qualname__} does not implement {missing}"
    unset = sorted({attr for base in entry.__mro__ for attr, kind in
                    getattr(base, "__annotations__", {}).items()
                    if "ClassVar" in str(kind) and not hasattr(entry, attr)})
    if unset:
        return f"{entry.__qualname__} does not set the class attribute(s) {', '.join(unset)}"
    declared = getattr(entry, "name", name)
    if declared != name:
        return f"{entry.__qualname__}.name is {declared!r}; it must be the entry point's name"
    return None
