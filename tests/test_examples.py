"""Every shipped experiment file parses; the built-in ones also pass the full pre-start checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from label_party.validate import check_chain
from splitleak.config import load_config
from splitleak.validation import check_core

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").rglob("*.toml"))
NEEDS_FILE = {"criteo_file.toml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    cfg = load_config(path)
    check_chain(cfg)
    if path.name not in NEEDS_FILE:
        check_core(cfg)


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4
