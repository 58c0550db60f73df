"""report.md sections on the threat model: who attacks and how, model completion, and batches
whose measured leak exceeds Marvell's Theorem-1 bound."""

from __future__ import annotations

from typing import Any

from attacker.report.cells import is_completion
from splitleak.markdown import fmt, md_table


def threat_md(summary: dict[str, Any]) -> list[str]:
    """The threat model every number below assumed (from config.toml's [threat])."""
    threat = summary.get("threat")
    if not threat:
        return []
    rows = []
    for key, party in sorted(threat.get("parties", {}).items(), key=lambda kv: int(kv[0])):
        low, high = party.get("clamp", (1.0, 5.0))
        deviation = (f"malicious optimizer (γ={party['gamma']:g}, clamp [{low:g}, {high:g}])"
                     if party.get("optimizer") == "malicious" else "honest (follows the protocol)")
        labelled = party.get("labelled_per_class")
        rows.append([key, "yes" if party.get("curious") else "no", deviation,
                     ", ".join(map(str, party.get("hints", []))) or "-",
                     f"{labelled}/class" if labelled else "-",
                     str(party["seed"]) if party.get("seed") is not None else "run seed"])
    groups = ", ".join("+".join(map(str, g)) for g in threat.get("collusion", [])) or "none"
    return ["## Threat model", "",
            "Adversarial passive parties (config.toml `[threat]`); parties not listed are honest and "
            "not tapped. Curious: the sidecar records the gradients it receives.", "",
            *md_table(["party", "curious", "behaviour", "hints k", "labelled examples",
                       "side-knowledge seed"], rows),
            f"Colluding groups (analysed together): {groups}. Random side knowledge is drawn "
            f"{summary.get('draws', threat.get('draws', '?'))} times per batch (R); tables give the mean "
            "over draws and ± its standard deviation across draws.", ""]


def completion_md(summary: dict[str, Any]) -> list[str]:
    """Fu et al.'s model completion: accuracy pooled over rows, next to both baselines."""
    entries = [e for e in summary["leak"] if e["layer"] == "bottom" and e["scope"] == "run"
               and is_completion(e)]
    if not entries:
        return []
    entries.sort(key=lambda e: bool(e.get("diagnostic")))  # the comparable figures first
    rows, failed = [], []
    for e in entries:
        who = "+".join(map(str, e.get("parties") or [e["party_id"]]))
        if "error" in e:
            failed.append(f"- {e['attack']}, parties {who}: {e['error']}")
            continue
        c = e["completion"]
        base = c.get("baselines", {})
        role = "diagnostic" if e.get("diagnostic") else "comparable"
        cells = [who, e.get("threat") or "?", e["attack"], str(c["labelled"])]
        for split in ("train", "test"):
            cells += [fmt(c[split]["top1"]), fmt(c[split].get("top5"))]
        for name in ("labelled_only", "random_bottom"):
            cells.append(f"{fmt(base[name]['train']['top1'])} / {fmt(base[name]['test']['top1'])}"
                         if name in base else "-")
        cells += [str(e["seed"]), role]
        rows.append(cells)
    lines = ["## Model completion", "",
             "Fu et al.'s passive (honest party) or active (malicious optimizer) label inference: a head "
             "on the party's trained bottom model, trained with MixMatch on the labelled train rows and "
             "the party's other train rows; accuracy of the EMA model pooled over rows (train rows "
             "exclude the labelled ones; top-5 for ten or more classes). Baselines: the same head on "
             "the labelled rows alone; MixMatch on a randomly initialised bottom (what the features "
             "give without anything learnt in training). Comparable: the figure Fu et al.'s and the "
             "KD^k paper's tables give (bottom fine-tuned); diagnostic: a variant that isolates a part "
             "of it, here the bottom frozen (the label information training put into the bottom "
             "itself), not to be set beside the papers' numbers.", ""]
    if rows:
        lines += md_table(["parties", "threat", "attack", "labelled", "train top-1", "train top-5",
                           "test top-1", "test top-5", "labelled only (train / test)",
                           "random bottom (train / test)", "seed", "figure"], rows)
    return lines + ([*failed, ""] if failed else [])


def above_bound_notes(summary: dict[str, Any]) -> list[str]:
    """One warning per party whose per-batch leak exceeded the Theorem-1 bound, with the reason."""
    notes = []
    for party in sorted({a["party_id"] for a in summary.get("above_bound", [])}):
        found = [a for a in summary["above_bound"] if a["party_id"] == party]
        worst = max(found, key=lambda a: (a["above"], a["max_excess"]))
        notes.append(
            f"party {party}: the measured leak AUC (cut layer, flip-corrected, mean over draws) exceeds "
            f"Marvell's Theorem-1 bound in some batches for {len(found)} attack(s); most often "
            f"{worst['attack']}: {worst['above']} of {worst['batches']} batches, by up to "
            f"{worst['max_excess']:.3f} (all in 'Theorem-1 AUC bound vs measured leak'). The bound "
            "holds for the Gaussian model Marvell fits to each batch; a per-batch AUC from few rows is "
            "noisy, and real gradients are not Gaussian, so a batch can exceed it.")
    return notes
