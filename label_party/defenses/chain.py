"""The label party's defense chain: the configured defenses applied in order to one party's g."""

from __future__ import annotations

import numbers
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from label_party.defenses.base import (
    DEFENSES,
    Defense,
    DefenseContext,
    DefenseError,
    DefenseParams,
    instantiate,
)
from label_party.finite import all_finite
from splitleak.provenance import blamed, plugin_origin
from splitleak.seeding import generator


def defense_generator(seed: int, position: int, party_id: int, step: int) -> torch.Generator:
    """The generator of one defense call: a stable function of (run seed, position, party, step)."""
    return generator(seed, "defense", position, party_id, step)


class DefenseChain:
    """Built from [(name, params), …] (or [{"name": …, "params": …}, …]); empty = identity.

    Parameters are validated when the chain is built. Each passive party gets its own instance
    of every defense (created at its first batch), so stateful defenses never mix parties.
    """

    def __init__(self, specs: Iterable[Any], seed: int) -> None:
        self.seed = int(seed)
        self._specs: list[tuple[type[Defense], DefenseParams]] = []
        for spec in specs:
            name, params = _name_and_params(spec)
            cls = DEFENSES.get(name)
            self._specs.append((cls, cls.Params.model_validate(params)))
        self._parties: dict[int, list[Defense]] = {}

    @property
    def names(self) -> list[str]:
        return [cls.name for cls, _ in self._specs]

    @property
    def classes(self) -> list[type[Defense]]:
        return [cls for cls, _ in self._specs]

    @property
    def needs_class_gradients(self) -> bool:
        """Some defense of the chain reads ctx.class_gradients (e.g. grad_perturb)."""
        return any(cls.needs_class_gradients for cls, _ in self._specs)

    @property
    def instances(self) -> dict[int, list[Defense]]:
        """The instances created so far, by party (a party that sent no batch has none)."""
        return self._parties

    def defenses(self, party_id: int) -> list[Defense]:
        """The instances serving one passive party (created on first use)."""
        if party_id not in self._parties:
            self._parties[party_id] = [instantiate(cls, params) for cls, params in self._specs]
        return self._parties[party_id]

    def apply(
        self,
        cut_gradient: torch.Tensor,
        labels: torch.Tensor,
        party_id: int,
        epoch: int,
        step: int,
        num_classes: int,
        class_gradients: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Run the chain on one party's [B, *shape] gradient; returns (g̃, per-batch diagnostics).

        `class_gradients` ([K, B, *shape], clean) reaches every defense of the chain unchanged.
        A defense named twice in the chain gets its diagnostics keys prefixed "<position>:".
        """
        names = self.names
        diagnostics: dict[str, float] = {}
        gradient = cut_gradient
        outputs = []
        for position, defense in enumerate(self.defenses(party_id)):
            ctx = DefenseContext(
                labels=labels,
                party_id=party_id,
                epoch=epoch,
                step=step,
                num_classes=num_classes,
                generator=defense_generator(self.seed, position, party_id, step),
                class_gradients=class_gradients,
            )
            with blamed("defense", defense.name, type(defense), "__call__", DefenseError):
                given, gradient = gradient, defense(gradient, ctx)
            _check_form(defense, given, gradient, party_id, step)
            found = _checked_diagnostics(defense, ctx.diagnostics, party_id, step)
            outputs.append(gradient)
            prefix = f"{position}:" if names.count(defense.name) > 1 else ""
            diagnostics.update({prefix + key: value for key, value in found.items()})
        if outputs and not all_finite(gradient):  # one check of the chain's output; the
            _blame_non_finite(self.defenses(party_id), outputs, party_id, step)  # input is finite
        return gradient, diagnostics

    def state_dict(self) -> dict[str, Any]:
        """Every instance's state by party (and the chain's names, to catch a changed chain)."""
        return {"chain": self.names,
                "parties": {str(k): [d.state_dict() for d in defenses]
                            for k, defenses in sorted(self._parties.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["chain"]) != self.names:
            raise ValueError(f"the checkpoint's defense chain {state['chain']} is not this "
                             f"chain {self.names}")
        for party, states in state["parties"].items():
            for defense, defense_state in zip(self.defenses(int(party)), states, strict=True):
                defense.load_state_dict(defense_state)

    def summary(self) -> dict[str, Any]:
        """Run-level figures of every defense instance, by party."""
        return {
            "chain": self.names,
            "seed": self.seed,
            "parties": {
                str(party_id): [
                    {"position": position, "name": defense.name, **_summary(defense)}
                    for position, defense in enumerate(defenses)
                ]
                for party_id, defenses in sorted(self._parties.items())
            },
        }


def chain_summaries(chains: Mapping[int, DefenseChain]) -> dict[int, dict[str, Any]]:
    """Every party's chain summary; a defense whose figures compose over the parties (one
    example's label reaches every party's gradient) adds the joint ones to each party's entry."""
    summaries = {k: chain.summary() for k, chain in chains.items()}
    by_position: dict[int, list[Defense]] = defaultdict(list)
    for chain in chains.values():
        for defenses in chain.instances.values():
            for position, defense in enumerate(defenses):
                by_position[position].append(defense)
    for position, instances in by_position.items():
        joint = type(instances[0]).joint_summary(instances)
        for summary in summaries.values() if joint else ():
            for entries in summary["parties"].values():
                entries[position].update(joint)
    return summaries


def _summary(defense: Defense) -> dict[str, Any]:
    with blamed("defense", defense.name, type(defense), "summary", DefenseError):
        figures = defense.summary()
    if not isinstance(figures, dict):
        raise DefenseError(f"{plugin_origin('defense', defense.name, type(defense))}: summary() "
                           f"returned a {type(figures).__name__}; it must return a dict")
    return figures


def _check_form(defense: Defense, given: torch.Tensor, returned: object, party_id: int,
                step: int) -> None:
    """DefenseError where a defense returned other than a tensor of its input's shape and dtype:
    what the label party sends, and what the party's backward pass needs."""
    if isinstance(returned, torch.Tensor) and returned.shape == given.shape and \
            returned.dtype == given.dtype:
        return
    found = (f"{returned.dtype} {list(returned.shape)}" if isinstance(returned, torch.Tensor)
             else f"a {type(returned).__name__}")
    raise DefenseError(f"{plugin_origin('defense', defense.name, type(defense))}: __call__() "
                       f"returned {found} for passive party {party_id} at train step {step}; it "
                       f"must return a tensor of its input's shape and dtype ({given.dtype} "
                       f"{list(given.shape)})")


def _checked_diagnostics(defense: Defense, diagnostics: dict[str, Any], party_id: int,
                         step: int) -> dict[str, Any]:
    """A defense's ctx.diagnostics as metrics.jsonl records them, numbers: a numpy scalar (np.float32)
    as the float it is; DefenseError where one is no number (a tensor, say)."""
    checked = {}
    for key, value in diagnostics.items():
        if not isinstance(value, numbers.Real):
            raise DefenseError(f"{plugin_origin('defense', defense.name, type(defense))}: "
                               f"ctx.diagnostics[{key!r}] is a {type(value).__name__} for passive "
                               f"party {party_id} at train step {step}; each must be a float "
                               "(e.g. float(tensor))")
        checked[key] = value if isinstance(value, (int, float)) else float(value)
    return checked


def _blame_non_finite(defenses: list[Defense], outputs: list[torch.Tensor], party_id: int,
                      step: int) -> None:
    """DefenseError naming the first defense of the chain whose output is not finite (its input,
    the objective's gradient or the previous defense's output, was)."""
    position = next(i for i, out in enumerate(outputs) if not all_finite(out))
    defense = defenses[position]
    raise DefenseError(f"{plugin_origin('defense', defense.name, type(defense))}: __call__() "
                       f"returned a gradient with NaN or Inf for passive party {party_id} at "
                       f"train step {step} (position {position} of the chain) from a finite one")


def _name_and_params(spec: Any) -> tuple[str, Mapping[str, Any]]:
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"name", "params"}
        if "name" not in spec or unknown:
            raise ValueError(f"a chain entry needs 'name' and optional 'params'; got {dict(spec)}")
        return str(spec["name"]), spec.get("params") or {}
    name, params = spec
    return str(name), params or {}
