"""The terminal summary of `splitleak compare` and `splitleak sweep`: every setting appears,
those with no leak at the compared layer (the VFLAIR example's backdoor and missing-features
scenarios) in their own table."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from orchestration.compare.command import measured_elsewhere
from orchestration.compare.table import Comparison


def _row(key: str, attack: str, layer: str, utility: float, c_dcs: float) -> dict[str, object]:
    return {"setting_key": key, "attack": attack, "layer": layer, "diagnostic": False,
            "utility_mean": utility, "c_dcs_mean": c_dcs}


def test_settings_without_a_leak_at_the_compared_layer_are_printed_with_their_capability() -> None:
    settings = [SimpleNamespace(key=k, label=f"none, threat={k}") for k in ("clean", "backdoor", "missing")]
    capability = [_row("clean", "direct_label", "cut", 0.757, 0.672),
                  _row("backdoor", "replacement_backdoor", "output", 0.755, 1.0),
                  _row("missing", "missing_features", "output", 0.723, 0.869)]
    comparison = Comparison(rows=[capability[0]], settings=settings, party=1, layer="cut",  # type: ignore[arg-type]
                            leak_stat="flipped_p95", capability=capability)
    console = Console(width=200, record=True)
    console.print(measured_elsewhere(comparison))
    text = console.export_text()
    assert "settings with no leak at the cut layer" in text
    assert "none, threat=backdoor" in text and "0.7550" in text and "1.000" in text
    assert "replacement_backdoor (output)" in text and "missing_features (output)" in text
    assert "none, threat=clean" not in text  # in the trade-off table already
    every = Comparison(rows=capability, settings=settings, party=1, layer="cut",  # type: ignore[arg-type]
                       leak_stat="flipped_p95", capability=capability)
    assert measured_elsewhere(every) is None
