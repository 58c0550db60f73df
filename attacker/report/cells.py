"""Cells shared by the terminal's tables and report.md: tags for side knowledge and threat,
spread and skip counts, the run-level entries in table order."""

from __future__ import annotations

import math
import re
from typing import Any

FLIPPED = "flip-corrected leak AUC max(AUC, 1 − AUC)"
OTHER_METRICS = "label attacks: label accuracy; count attacks: count error Σ|n̂ − n|/2B, 0 = exact"
LAYER_ORDER = {"cut": 0, "first": 1, "activation": 2}


def layer_key(layer: str) -> int:
    return LAYER_ORDER.get(layer, len(LAYER_ORDER))


def side_knowledge_tag(attack: str, sentence: str) -> str:
    """A few words for a table cell, from the attack's label; report.md has the full sentence."""
    name, _, rest = attack.partition("(")
    params = dict(p.split("=", 1) for p in rest.rstrip(")").split(", ") if "=" in p)
    if params.get("centers") == "oracle":
        return "all labels (oracle)"
    if params.get("centers") == "oracle_loo":
        return "all other labels (oracle)"
    if params.get("centers") == "hint":
        return f"≥{params.get('hints', '?')} labels/class/batch"
    if "k" in params:
        return f"{params['k']} positive{'' if params['k'] == '1' else 's'}/batch"
    known = {"cosine_oracle": "1 clean positive/batch", "cosine_majority": "positives = minority",
             "clustering": "minority / best permutation",
             "model_completion": f"own bottom, {params.get('labelled_per_class', '?')} labelled/class"}
    if name in known:
        return known[name]
    if re.match(r"none\b", sentence):
        return "none"
    return sentence if len(sentence) <= 28 else sentence[:27] + "…"


def parties_label(entry: dict[str, Any]) -> str:
    """"1", or "1+2" for a colluding group."""
    return "+".join(map(str, entry.get("parties") or [entry["party_id"]]))


def is_completion(entry: dict[str, Any]) -> bool:
    """A model completion's entry, its figures or its failure (another run-level attack's
    failure, e.g. EXACT's, is not one: the analysis's warnings name it)."""
    return "completion" in entry or (entry.get("name") == "model_completion" and "error" in entry)


def run_entries(summary: dict[str, Any], completion: bool = False) -> list[dict[str, Any]]:
    """Run-level gradient-attack entries (or, with `completion`, the model-completion ones) by
    party, then layer (cut first), then in the analysis' attack order."""
    entries = [e for e in summary["leak"] if e["scope"] == "run" and "exact" not in e
               and e["layer"] not in ("input", "output")
               and (is_completion(e) if completion else "completion" not in e and "error" not in e)]
    return sorted(entries, key=lambda e: (len(e.get("parties") or [1]), e["party_id"],
                                          layer_key(e["layer"])))


def threat_tag(entry: dict[str, Any]) -> str:
    """A word or two for a table cell: curious / malicious / colluding; report.md has the rest."""
    if len(entry.get("parties") or [1]) > 1:
        return f"colluding {parties_label(entry)}"
    threat = entry.get("threat") or ""
    return "malicious" if "malicious" in threat else "curious" if threat else "not recorded"


def spread_cell(entry: dict[str, Any], stat: str = "p95") -> str:
    spread = ((entry.get("spread") or {}).get("flipped") or {}).get(stat)  # None: every batch skipped
    return f"±{spread['std']:.3f}" if spread and spread.get("std") is not None and math.isfinite(
        spread["std"]) else ""


def received_tag(entry: dict[str, Any], tag: str) -> str:
    """An anchor attack's tag, saying when some anchors were received rows, not clean ones."""
    received = entry.get("received_anchors") or 0
    return f"{tag}; {received} received" if received else tag


def skip_cell(entry: dict[str, Any]) -> str:
    degenerate = entry.get("degenerate") or 0
    return f"{entry['skipped']}/{entry['batches']}" + (f" ({degenerate} tied)" if degenerate else "")
