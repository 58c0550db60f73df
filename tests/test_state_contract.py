"""The state contract of checkpoints: every registered objective and defense, the defense chain,
the label party's trainer and the passive party's bottom continue exactly after a round trip
through `state_dict()` -> a checkpoint file -> `load_state_dict()` of a fresh instance."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from label_party.defenses import DEFENSES, DefenseChain, build_defense
from label_party.objectives import OBJECTIVES, build_objective
from label_party.setup import load_label_party_data
from label_party.trainer import LabelPartyTrainer
from passive_party.client import load_bottom
from splitleak.config import parse_config
from tests.conftest import small_config
from tests.test_defenses import PARAMS as DEFENSE_PARAMS
from tests.test_defenses import binary_class_gradients, context, two_class_batch
from tests.test_objectives import PARAMS as OBJECTIVE_PARAMS
from tests.test_objectives import batch, objective_case


def through_a_file(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint does to a state: torch.save, then the safe (weights-only) load."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_every_plugin_is_covered() -> None:
    assert sorted(OBJECTIVE_PARAMS) == sorted(OBJECTIVES.names())
    assert sorted(DEFENSE_PARAMS) == DEFENSES.names()


@pytest.mark.parametrize("name", sorted(OBJECTIVE_PARAMS))
def test_objective_continues_exactly_after_load(name: str, tmp_path: Path) -> None:
    _, setup = objective_case(name, tmp_path)
    original = build_objective(name, OBJECTIVE_PARAMS[name], setup)
    for step in range(3):
        original.train_step(*batch(setup, seed=step))
    state = through_a_file(original.state_dict())
    resumed = build_objective(name, OBJECTIVE_PARAMS[name], setup)
    resumed.load_state_dict(state)
    for step in range(3, 6):
        a = original.train_step(*batch(setup, seed=step))
        b = resumed.train_step(*batch(setup, seed=step))
        assert a.loss == b.loss, f"{name}: step {step} loss differs after the round trip"
        assert all(torch.equal(x, y) for x, y in zip(a.gradients, b.gradients, strict=True))
        assert a.metrics == b.metrics
    acts, own, _, _ = batch(setup, seed=9)
    detached = [x.detach() for x in acts]
    assert torch.equal(original.predict(detached, own), resumed.predict(detached, own))
    assert original.summary() == resumed.summary()


def _defense_steps(defense, steps: range) -> list[tuple[torch.Tensor, dict]]:
    out = []
    for step in steps:
        gradient, labels = two_class_batch(24, (6,), seed=step)
        per_class = binary_class_gradients(gradient) if defense.needs_class_gradients else None
        ctx = context(labels, seed=100 + step, epoch=step // 3, step=step, class_gradients=per_class)
        out.append((defense(gradient, ctx), dict(ctx.diagnostics)))
    return out


@pytest.mark.parametrize("name", sorted(DEFENSE_PARAMS))
def test_defense_continues_exactly_after_load(name: str) -> None:
    original = build_defense(name, DEFENSE_PARAMS[name])
    _defense_steps(original, range(0, 4))  # epoch 0 and the start of epoch 1
    resumed = build_defense(name, DEFENSE_PARAMS[name])
    resumed.load_state_dict(through_a_file(original.state_dict()))
    later = range(4, 8)
    for (a, da), (b, db) in zip(_defense_steps(original, later), _defense_steps(resumed, later),
                                strict=True):
        assert torch.equal(a, b), f"{name}: output differs after the round trip"
        assert da == db
    assert original.summary() == resumed.summary()


def test_a_stateful_defense_needs_its_state() -> None:
    """The check above can fail: discrete_sgd without its first-epoch statistics differs."""
    original = build_defense("discrete_sgd", {"bins": 6})
    _defense_steps(original, range(0, 4))
    fresh = build_defense("discrete_sgd", {"bins": 6})
    a, _ = _defense_steps(original, range(4, 5))[0]
    b, _ = _defense_steps(fresh, range(4, 5))[0]
    assert not torch.equal(a, b)


def test_chain_state_is_per_party_and_refuses_another_chain() -> None:
    specs = [("discrete_sgd", {"bins": 6}), ("dp_gaussian", {"clip": 1.0, "noise_multiplier": 1.0})]
    chain = DefenseChain(specs, seed=1)
    gradient, labels = two_class_batch(24, (6,))
    for party in (1, 2):
        chain.apply(gradient * party, labels, party_id=party, epoch=0, step=0, num_classes=2)
    resumed = DefenseChain(specs, seed=1)
    resumed.load_state_dict(through_a_file(chain.state_dict()))
    assert resumed.summary() == chain.summary()
    for party in (1, 2):
        a, _ = chain.apply(gradient, labels, party_id=party, epoch=1, step=5, num_classes=2)
        b, _ = resumed.apply(gradient, labels, party_id=party, epoch=1, step=5, num_classes=2)
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="defense chain"):
        DefenseChain(specs[:1], seed=1).load_state_dict(chain.state_dict())


def test_trainer_and_bottom_continue_exactly(tmp_path: Path) -> None:
    from label_party.schedule import schedule

    cfg = parse_config(small_config(tmp_path, defense=[{"name": "discrete_sgd", "bins": 6}]))
    data = load_label_party_data(cfg)

    def build() -> tuple[LabelPartyTrainer, dict]:
        bottoms = {k: load_bottom(cfg, k) for k in (1, 2)}
        shapes = {k: b.embedding_shape for k, b in bottoms.items()}
        return LabelPartyTrainer(cfg, data.labels, data.num_classes, shapes, None,
                                 data.train_ids), bottoms

    def step(trainer: LabelPartyTrainer, bottoms: dict, b) -> tuple[dict, dict]:
        acts = {k: bottom.forward(b.sample_ids, True) for k, bottom in bottoms.items()}
        gradients, record = trainer.train_step(b, acts)
        for k, bottom in bottoms.items():
            bottom.backward(gradients[k])
        return gradients, record

    train = [b for b in schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed)
             if b.phase.name == "TRAIN"]
    trainer, bottoms = build()
    for b in train[:4]:
        step(trainer, bottoms, b)
    trainer2, bottoms2 = build()
    trainer2.load_state_dict(through_a_file(trainer.state_dict()))
    for k in bottoms2:
        bottoms2[k].load_state_dict(through_a_file(bottoms[k].state_dict()))
    for b in train[4:8]:
        g1, r1 = step(trainer, bottoms, b)
        g2, r2 = step(trainer2, bottoms2, b)
        assert r1 == r2 and all(torch.equal(g1[k], g2[k]) for k in g1)
    for k in bottoms:
        for name, value in bottoms[k].model.state_dict().items():
            assert torch.equal(value, bottoms2[k].model.state_dict()[name]), name
    with pytest.raises(ValueError, match="party 1's, not party 2's"):
        bottoms2[2].load_state_dict(bottoms[1].state_dict())
    assert np.isfinite(r1["loss"])


@pytest.mark.parametrize("split", [False, True], ids=["one-pass", "split-backward"])
def test_the_label_party_update_is_applied_before_anything_reads_it(tmp_path: Path,
                                                                   split: bool) -> None:
    """A train step leaves the label party's own update pending (the driver runs it while the
    parties compute); the next step, an evaluation and a checkpoint apply it first, so every
    number is the one of updating at once, also where the backward pass to the parameters
    waits for the update too (split_backward)."""
    from label_party.schedule import schedule

    cfg = parse_config(small_config(tmp_path))
    data = load_label_party_data(cfg)
    bottoms = {k: load_bottom(cfg, k) for k in (1, 2)}
    shapes = {k: b.embedding_shape for k, b in bottoms.items()}
    eager, deferred = (LabelPartyTrainer(cfg, data.labels, data.num_classes, shapes, None,
                                         data.train_ids) for _ in range(2))
    batches = list(schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed))
    train = [b for b in batches if b.phase.name == "TRAIN"][:4]
    evaluation = next(b for b in batches if b.phase.name == "EVAL")
    deferred.objective.split_backward = split
    top = deferred.objective.top  # type: ignore[attr-defined]
    for b in train:
        acts = {k: bottom.forward(b.sample_ids, True).detach() for k, bottom in bottoms.items()}
        g1, r1 = eager.train_step(b, acts)
        eager.update()
        deferred.update()  # the previous step's, as the driver runs it during the exchange
        before = [p.detach().clone() for p in top.parameters()]
        g2, r2 = deferred.train_step(b, acts)
        assert all(torch.equal(p, q) for p, q in zip(before, top.parameters(), strict=True)), (
            "the update ran before the gradients were sent")
        assert r1 == r2 and all(torch.equal(g1[k], g2[k]) for k in g1)
    acts = {k: bottom.forward(evaluation.sample_ids, False) for k, bottom in bottoms.items()}
    views = [acts[1], acts[2]], (None, None)
    assert not torch.equal(eager.objective.predict(*views), deferred.objective.predict(*views))
    deferred.eval_step(evaluation, acts)  # applies the pending update first
    assert torch.equal(eager.objective.predict(*views), deferred.objective.predict(*views))
    for b, read in zip(train[:2], ("state_dict", "model_state"), strict=True):
        acts = {k: bottom.forward(b.sample_ids, True).detach() for k, bottom in bottoms.items()}
        eager.train_step(b, acts)
        eager.update()
        deferred.train_step(b, acts)
        got = getattr(deferred, read)()  # a checkpoint, top.pt: the pending update first
        want = getattr(eager, read)()
        if read == "state_dict":
            got, want = got["objective"], want["objective"]
        for name, value in want["top"].items():
            assert torch.equal(value, got["top"][name]), f"{read}: {name}"


@pytest.mark.parametrize("name", sorted(OBJECTIVE_PARAMS))
def test_a_split_backward_gives_every_objective_the_same_numbers(name: str, tmp_path: Path) -> None:
    """The backward pass to the activations first and to the parameters with the update is
    the same operations as one pass: losses, gradients, predictions and states bit for bit."""
    _, setup = objective_case(name, tmp_path)
    one, split = (build_objective(name, OBJECTIVE_PARAMS[name], setup) for _ in range(2))
    split.split_backward = True
    for step in range(4):
        asked = one.supports_class_gradients
        a = one.train_step(*batch(setup, seed=step), class_gradients=asked)
        b = split.train_step(*batch(setup, seed=step), class_gradients=asked)
        assert a.loss == b.loss and a.metrics == b.metrics, f"{name}: step {step}"
        assert all(torch.equal(x, y) for x, y in zip(a.gradients, b.gradients, strict=True))
        assert (a.class_gradients is None) == (b.class_gradients is None)
        for x, y in zip(a.class_gradients or [], b.class_gradients or [], strict=True):
            assert torch.equal(x, y)
    acts, own, _, _ = batch(setup, seed=9)
    detached = [x.detach() for x in acts]
    assert torch.equal(one.predict(detached, own), split.predict(detached, own))
    assert same(one.state_dict(), split.state_dict()), f"{name}: the states differ"


def same(a: Any, b: Any) -> bool:
    """Equal bit for bit, through nested dicts and lists of tensors and numbers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b
