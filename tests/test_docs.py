"""The docs cannot go stale silently: the configuration page is the generator's output, every
relative link resolves, and every registered plug-in is documented."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from attacker.attacks import ATTACKS
from label_party.defenses import DEFENSES
from label_party.objectives import OBJECTIVES
from splitleak.config_doc import NOTES, configuration_page, field_paths

ROOT = Path(__file__).resolve().parent.parent
# Every page a reader reaches: the two top-level pages, every page under docs/ (sub-folders such
# as docs/reconstruction/ and docs/sweeps/*/ included) and every example's README.
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "examples").rglob("README.md")])
# Links and images alike: `[text](target)` and `![alt](target)`.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def test_configuration_page_is_generated() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == configuration_page(), (
        "docs/configuration.md is stale: python -m splitleak.config_doc > docs/configuration.md")


def test_notes_name_real_fields() -> None:
    assert set(NOTES) <= set(field_paths()), sorted(set(NOTES) - set(field_paths()))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, broken


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize(("page", "names"), [
    ("defenses.md", DEFENSES.built_in_names()),
    ("defenses.md", OBJECTIVES.built_in_names()),
    ("attacks.md", ATTACKS.built_in_names()),
])
def test_every_plugin_is_documented(page: str, names: list[str]) -> None:
    text = (ROOT / "docs" / page).read_text()
    assert [name for name in names if f"`{name}`" not in text] == []


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser an entry point built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser(main: Callable[[list[str]], int], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser `main` builds, caught at its parse_args: nothing runs."""
    def caught(self: argparse.ArgumentParser, *_: object, **__: object) -> None:
        raise _Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(_Parsed) as parsed:
            main([])
    return parsed.value.parser


def _options(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Each optional argument's spellings, --help left out."""
    return [action.option_strings for action in parser._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)]


def _commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    """`prog sub` -> its parser, for every sub-command of the four entry points."""
    from attacker.cli import main as attacker
    from label_party.cli import main as label_party
    from orchestration.cli import main as splitleak
    from orchestration.gafm_select import main as gafm_select
    from passive_party.cli import main as passive_party

    found = {}
    for main in (splitleak, label_party, passive_party, attacker):
        parser = _parser(main, monkeypatch)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        found |= {f"{parser.prog} {name}": p for name, p in sub.choices.items()}
    found["splitleak gafm-select"] = _parser(gafm_select, monkeypatch)  # its own parser
    return found


def test_commands_page_names_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every option `--help` shows is in docs/commands.md, in its command's row(s)."""
    page = (ROOT / "docs" / "commands.md").read_text()
    missing = []
    for command, parser in _commands(monkeypatch).items():
        rows = " ".join(line for line in page.splitlines() if line.startswith(f"| `{command}"))
        if not rows:
            missing.append(command)
            continue
        missing += [f"{command} {spellings[-1]}" for spellings in _options(parser)
                    if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", rows)
                               for s in spellings)]
    assert missing == [], missing


def test_experiment_file_lists_every_dataset() -> None:
    """The `[dataset] name` comment of experiment-file.md names exactly the registered datasets."""
    from splitleak.datasets import DATASETS

    page = (ROOT / "docs" / "experiment-file.md").read_text()
    block = re.search(r'^name = "breast_cancer" +#(.*?)^params', page, re.M | re.S)
    assert block is not None, "experiment-file.md: no [dataset] name line"
    comment = re.sub(r"\([^)]*\)|#", " ", block.group(1))  # drop "(extra `images`)"
    listed = set(re.findall(r"[a-z][a-z0-9_]*", comment)) - {"and"}
    assert listed == set(DATASETS.built_in_names())


def test_every_numeric_default_is_stated_in_its_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak certs --help` said "--days: validity, 1..36500" and `splitleak soak --help`
    gave no default for --messages, --parties, --steps or --seed: a user learnt them only from
    the code. Every option with a numeric default now says it in its --help."""
    silent = []
    for command, parser in _commands(monkeypatch).items():
        for action in parser._actions:
            default = action.default
            if (not action.option_strings or isinstance(default, bool)
                    or not isinstance(default, int | float)):
                continue
            shown = {str(default), f"{default:,}", f"{default:g}"}
            text = action.help or ""
            if "default" not in text or not any(s in text for s in shown):
                silent.append(f"{command} {action.option_strings[-1]} (default {default})")
    assert silent == [], silent


def test_every_default_is_stated_in_its_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """`splitleak compare --help` gave no default for --layer (cut), `splitleak health --help`
    none for --identity (attacker), `splitleak relay --help` none for --listen (127.0.0.1:0)
    and `passive-party run --help` none for --run-dir (the current directory, where the
    party's bottom model then lands): every option with a default other than unset or a flag's
    off now says "default" in its --help."""
    silent = []
    for command, parser in _commands(monkeypatch).items():
        for action in parser._actions:
            if (not action.option_strings or action.default in (None, "", argparse.SUPPRESS)
                    or isinstance(action.default, bool)):
                continue
            text = action.help or ""
            text = text % dict(vars(action), prog=parser.prog) if "%(" in text else text
            said = " ".join(text.replace(",", "").split())
            if "default" not in said or not any(form in said for form in _forms(action.default)):
                silent.append(f"{command} {action.option_strings[-1]} (default {action.default!r})")
    assert silent == [], silent


def _forms(default: object) -> list[str]:
    """How a help text may write an option's default value: 5, 5.0, 60, 1,000,000 (commas
    dropped), a path's name, a list's items."""
    if isinstance(default, list | tuple):
        return [" ".join(map(str, default)), *map(str, default)] if default else ["default"]
    if isinstance(default, float):
        return [f"{default:g}", str(default)]
    return [str(getattr(default, "name", default)), str(default)]


def _run_dir_paths() -> dict[str, str]:
    """Every path RunDir names, relative to the run directory, a party's id written `<k>`."""
    import inspect

    from splitleak.artifacts.paths import RunDir

    root = Path("RUN")
    run = RunDir(root)
    found = {}
    for name, member in inspect.getmembers(RunDir):
        if isinstance(member, property):
            path = getattr(run, name)
        elif inspect.isfunction(member) and list(inspect.signature(member).parameters) == [
                "self", "party_id"]:
            path = member(run, 7)
        else:
            continue
        if isinstance(path, Path) and path != root:
            found[name] = str(path.relative_to(root)).replace("7", "<k>")
    return found


def test_run_directory_page_names_every_path_of_a_run() -> None:
    """attacker/received/ (the sidecar's log of what the label party receives from its
    [threat.receiver] victims) was on no page about the run directory. Every path RunDir names
    is now on run-directory.md, a sweep point's own files on sweeps.md."""
    pages = {"run-directory.md": (ROOT / "docs" / "run-directory.md").read_text(),
             "sweeps.md": (ROOT / "docs" / "sweeps.md").read_text()}
    elsewhere = {"point_result": "sweeps.md", "ray": "sweeps.md"}
    paths = _run_dir_paths()
    assert {"received", "gradients", "tap", "relay_address"} <= set(paths)
    missing = [f"{path} ({name})" for name, path in paths.items()
               if path not in pages[elsewhere.get(name, "run-directory.md")]]
    assert missing == [], missing
