"""`splitleak soak` end to end at toy size: it fuzzes every RPC of live services, runs a
many-party run, and reports what the long version reports (the figures are in the README's
sense: counts, hangs, crashes, RSS)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import scaled
from tests.runs import cli

pytestmark = pytest.mark.slow


def test_soak_reports_counts_hangs_crashes_and_memory() -> None:
    proc = cli("soak", "--messages", "40", "--parties", "3", "--steps", "60")
    out, _ = proc.communicate(timeout=scaled(600))
    text = " ".join(out.split())
    assert proc.returncode == 0, out
    for rpc in ("Join", "Train (not admitted)", "Record", "Train (admitted)"):
        assert f"{rpc} │ 40 │ 0 │ 0" in text, text  # 40 cases, no hang, no bad status
    assert "crashes: 0" in text and "long run: 60 train steps; ok" in text
    assert "passive party 3: RSS" in text
    assert re.search(r"service RSS \(MiB\) after 0 %: \d+, 25 %: \d+, 50 %: \d+, 75 %: \d+, "
                     r"100 %: \d+ of the cases", text), text
