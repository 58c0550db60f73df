"""scripts/threat_table.py's table: seed means with t intervals, per-seed changes against the
right no-defense file, and the baselines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "threat_table.py"
spec = importlib.util.spec_from_file_location("threat_table", SCRIPT)
assert spec is not None and spec.loader is not None
threat_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(threat_table)


def row(name: str, seed: int, utility: float, completion: float, **extra: object) -> dict:
    scores = {"train": completion, "test": completion / 2}
    return {"file": name, "seed": seed, "utility": utility, "fine_tuned": scores,
            "frozen": scores, "clustering": 0.5, **extra}


def test_each_file_is_compared_with_its_own_no_defense_file() -> None:
    assert threat_table.reference_of("kdk") == "none"
    assert threat_table.reference_of("kdk-active") == "none-active"
    assert threat_table.reference_of("marvell") == "none_binary"
    assert threat_table.reference_of("marvell-active") == "none_binary-active"
    assert threat_table.reference_of("none") == "none"
    every = {f"{d}{s}" for d in threat_table.DEFENSES for s in ("", "-active")}
    assert every == {p.stem for p in (SCRIPT.parent.parent / "examples" / "threat").glob("*.toml")
                     if "sweep" not in p.stem}


def test_table_gives_means_intervals_and_per_seed_changes() -> None:
    base = {"labelled_only": {"train": 0.6, "test": 0.5}, "random_bottom": {"train": 0.7, "test": 0.6}}
    rows = [row("none", 0, 0.96, 0.8, **base), row("none", 1, 0.94, 0.6, **base),
            row("kdk", 0, 0.90, 0.4), row("kdk", 1, 0.90, 0.45)]
    lines = threat_table.table(rows).splitlines()
    none = next(line for line in lines if line.startswith("| none |"))
    kdk = next(line for line in lines if line.startswith("| kdk |"))
    # none: mean 0.95, t(0.975, 1) = 12.706 times the standard error 0.01
    assert "| 2 | 0.950 ± 0.127 |" in none and "(" not in none
    # kdk against the same seed's none: -6 and -4 points, completion -50 % and -25 %
    assert "0.900 ± 0.000 (-5.0 pt)" in kdk
    assert "0.425 ± 0.318 (-38%)" in kdk  # mean of -50 % and -25 %
    assert "| none | 0.600 ± 0.000 / 0.500 ± 0.000 | 0.700 ± 0.000 / 0.600 ± 0.000 |" in lines
    assert lines[-1].startswith("| none |")  # kdk has no baselines row


def test_a_single_seed_has_no_interval() -> None:
    assert threat_table.mean_ci([0.25]) == "0.250"
    assert threat_table.mean_ci([0.2, 0.4]) == "0.300 ± 1.271"  # t(0.975, 1) · 0.1
