"""The verdict per attack: which setting to pick, the one on the Pareto frontier with the lowest
leak among those that cost at most a given utility against no defense."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# 0.01 of test AUC, or 1 point of test accuracy (utilities are fractions)
MAX_UTILITY_COST = 0.01


@dataclass(frozen=True)
class Verdict:
    attack: str
    max_cost: float
    best: dict[str, Any] | None  # the chosen setting's row; None: no setting has a utility cost
    baseline: dict[str, Any] | None  # the no-defense row it is measured against
    unmeasured: tuple[str, ...] = ()  # compared settings whose summaries lack the attack
    premise_failed: tuple[tuple[str, str], ...] = ()  # (setting, why): no verdict

    @property
    def defended(self) -> bool:
        """A defense beats no defense within the budget (the no-defense setting is its own
        baseline)."""
        return self.best is not None and self.best["setting"] != self.best["baseline"]

    def sentence(self) -> str:
        """One line, under a heading that states the budget."""
        if self.premise_failed:
            return (f"{self.attack}: no verdict, its premise fails for "
                    + "; ".join(f"{setting} ({why})" for setting, why in self.premise_failed))
        if not self.unmeasured:
            return self._choice()
        return (f"{self._choice()} (not measured for {', '.join(self.unmeasured)}: "
                "their summaries lack this attack)")

    def _choice(self) -> str:
        if self.best is None:
            return (f"{self.attack}: no verdict, no setting has a paired run without a defense "
                    "(no utility cost to hold it to)")
        leak = f"{self.best['leak_mean']:.3f}"
        if not self.defended:
            label = self.best["setting"]  # "no defense [hash]" where several set-ups have one
            name = label if label.startswith("no defense") else f"no defense ({label})"
            return (f"{self.attack}: {name}; none on the frontier within the budget leaks "
                    f"less than {name}'s {leak}")
        base = f"{self.baseline['leak_mean']:.3f}" if self.baseline else "?"
        return (f"{self.attack}: {self.best['setting']}, leak {leak} (no defense {base}) at a "
                f"utility cost of {round(self.best['utility_drop_mean'], 3) + 0.0:.3f}")  # no -0.000


# A drop of exactly the budget is affordable: 0.95 - 0.94 is 0.010000000000000009 in floats.
COST_TOLERANCE = 1e-9


def verdicts(rows: list[dict[str, Any]], attacks: list[str], max_cost: float,
             premise_failed: dict[str, dict[str, str]] | None = None) -> list[Verdict]:
    """One per ranked attack that is not a diagnostic: among its frontier settings whose mean paired
    utility drop is at most `max_cost` (no defense: 0), the lowest seed-mean leak, ties to the
    higher utility; none to pick where the attack's premise failed in a setting
    (`premise_failed`: attack -> {setting: why})."""
    out = []
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    for attack in attacks:
        group = [r for r in rows if r["attack"] == attack]
        if not group or group[0]["diagnostic"] or not group[0]["ranked"]:
            continue
        affordable = [r for r in group if r["pareto"] and r["utility_drop_mean"] is not None
                      and r["utility_drop_mean"] <= max_cost + COST_TOLERANCE]
        best = min(affordable, key=lambda r: (r["leak_mean"], -r["utility_mean"]), default=None)
        baseline = None
        if best is not None:
            baseline = next((r for r in group if r["setting"] == best["baseline"]), None)
        failed = (premise_failed or {}).get(attack, {})
        measured = {r["setting"] for r in group}
        unmeasured = tuple(s for s in settings if s not in measured and s not in failed)
        out.append(Verdict(attack, max_cost, best, baseline, unmeasured, tuple(failed.items())))
    return out
