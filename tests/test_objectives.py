"""Training objectives: conformance of every plug-in, and the pieces of label DP, KD^k and GAFM."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from torch.nn import functional as F

from label_party.objectives import OBJECTIVES, ObjectiveSetup, build_objective
from label_party.objectives.base import activation_gradients
from label_party.objectives.gafm import GAFM, PRESETS, GAFMParams, normalised_sum, soft_labels
from label_party.objectives.kdk import KDk, KDkParams, kdk_soft_labels
from label_party.objectives.label_dp import epsilon_for, flip_probability, randomized_response
from label_party.validate import check_chain
from orchestration.gafm_select import select_delta
from splitleak.config import ConfigError, parse_config
from splitleak.datasets import subset_ids
from splitleak.inputs import PartyInputs
from splitleak.models import InputSpec
from tests.conftest import small_config

HYPOTHESIS = settings(deadline=None, max_examples=40, derandomize=True)
ROWS = 240
OWN_COLUMNS = 6

# One valid parameter set per registered objective, with the config each needs.
PARAMS: dict[str, dict[str, Any]] = {
    "cross_entropy": {},
    "label_dp": {"epsilon": 1.0},
    "kdk": {"k": 2, "epsilon": 0.3, "teacher_epochs": 2, "teacher_lr": 0.01},
    "gafm": {"preset": "spambase"},
    "mid": {"lambda": 0.1},
    "dcor": {"alpha": 1.0},
    "pe_loss": {"alpha": 1.0},
    "cae": {"lambda": 0.5, "epochs": 2, "rows": 2000},
}


def config(tmp_path: Path, *, top: str = "none", label_party: bool = False, loss: str = "auto",
           **overrides: Any):
    model = {"kind": "mlp", "layers": [8], "cut_layer": 1, "top": top,
             "aggregation": "sum" if top == "none" else "concat"}
    features: dict[str, Any] = {"passive": [[0, 15], [15, 30]]}
    if label_party:
        features["label_party"] = [0, OWN_COLUMNS]
    data = small_config(tmp_path, model=model, features=features,
                        training={"loss": loss, "batch_size": 32}, **overrides)
    return parse_config(data)


def own_inputs(labels: np.ndarray, seed: int = 0) -> PartyInputs:
    """Numeric columns whose first coordinate tells the class (a teacher can learn it)."""
    gen = torch.Generator().manual_seed(seed)
    numeric = torch.randn(labels.size, OWN_COLUMNS, generator=gen)
    numeric[:, 0] += 3.0 * torch.from_numpy(labels).float()
    return PartyInputs(numeric, torch.zeros(labels.size, 0, dtype=torch.int64),
                       InputSpec(OWN_COLUMNS, ()))


def labels_for(num_classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, ROWS).astype(np.int64)


def setup_for(cfg, num_classes: int = 2, width: int = 1, parties: int = 2, seed: int = 0,
              own: bool = False) -> ObjectiveSetup:
    labels = labels_for(num_classes, seed)
    return ObjectiveSetup(cfg=cfg, labels=labels, train_ids=np.arange(ROWS // 2),
                          num_classes=num_classes, activation_shapes=[(width,)] * parties,
                          own_inputs=own_inputs(labels) if own else None, seed=seed)


def batch(setup: ObjectiveSetup, size: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = np.arange(size)
    acts = [torch.randn(size, *shape, generator=gen).requires_grad_(True)
            for shape in setup.activation_shapes]
    own = (None, None) if setup.own_inputs is None else setup.own_inputs.rows(torch.from_numpy(ids))
    return acts, own, ids, torch.from_numpy(setup.labels[ids])


def objective_case(name: str, tmp_path: Path, num_classes: int = 2, seed: int = 0):
    """A config and setup each objective accepts: GAFM binary with f(X) in R, KD^k with own
    features, the others on a top model."""
    if name == "gafm":
        cfg = config(tmp_path)
        return cfg, setup_for(cfg, num_classes, width=1, seed=seed)
    own = name == "kdk"
    cfg = config(tmp_path, top="mlp", label_party=own)
    return cfg, setup_for(cfg, num_classes, width=4, seed=seed, own=own)


# --- every registered objective ------------------------------------------------------------


def test_every_objective_has_a_case() -> None:
    assert set(OBJECTIVES.names()) == set(PARAMS)


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_conformance(name: str, tmp_path: Path) -> None:
    cfg, setup = objective_case(name, tmp_path)
    objective = build_objective(name, PARAMS[name], setup)
    acts, own, ids, y = batch(setup)
    result = objective.train_step(acts, own, ids, y)
    assert math.isfinite(result.loss)
    assert len(result.gradients) == len(acts)
    for gradient, act in zip(result.gradients, acts, strict=True):
        assert gradient is not None and gradient.shape == act.shape
        assert torch.isfinite(gradient).all() and gradient.abs().sum() > 0
    logits = objective.predict([a.detach() for a in acts], own)
    assert logits.shape == (len(ids), cfg.output_width(2)) and torch.isfinite(logits).all()
    assert isinstance(objective.summary(), dict)
    assert isinstance(objective.state_dict(), dict)


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_deterministic_by_seed(name: str, tmp_path: Path) -> None:
    def gradients(seed: int) -> list[torch.Tensor]:
        _, setup = objective_case(name, tmp_path, seed=seed)
        objective = build_objective(name, PARAMS[name], setup)
        out = []
        for step in range(3):
            acts, own, ids, y = batch(setup, seed=step)
            out += objective.train_step(acts, own, ids, y).gradients
        return out

    first, again = gradients(0), gradients(0)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("name, params", [
    ("label_dp", {}),
    ("label_dp", {"epsilon": 1.0, "flip_probability": 0.1}),
    ("label_dp", {"epsilon": -1.0}),
    ("kdk", {"epsilon": 1.5}),
    ("kdk", {"k": 1}),
    ("kdk", {"teacher_optimizer": "rmsprop"}),
    ("gafm", {"delta": 0.7}),
    ("gafm", {"preset": "mnist"}),
    ("gafm", {"gamma": 0}),
    ("gafm", {"unknown": 1}),
])
def test_bad_parameters_are_refused(name: str, params: dict, tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        OBJECTIVES.get(name).Params.model_validate(params)
    cfg = parse_config(small_config(tmp_path, objective={"name": name, **params}))
    with pytest.raises(ConfigError, match="objective"):
        check_chain(cfg)


# --- label DP ------------------------------------------------------------------------------


def test_flip_probability_matches_the_paper() -> None:
    assert flip_probability(math.log(9), 2) == pytest.approx(0.1)  # binary: 1/(e^ε + 1)
    assert epsilon_for(0.1, 2) == pytest.approx(2.2, abs=0.01)  # Qiu et al.: p = 0.1 → ε = 2.2
    assert epsilon_for(0.01, 2) == pytest.approx(4.6, abs=0.01)  # p = 0.01 → ε = 4.6
    eps = 1.3
    keep = math.exp(eps) / (math.exp(eps) + 9)  # K classes: keep with e^ε/(e^ε + K − 1)
    assert 1 - flip_probability(eps, 10) == pytest.approx(keep)
    for k in (2, 3, 10):
        assert epsilon_for(flip_probability(eps, k), k) == pytest.approx(eps)
    with pytest.raises(ValueError, match="ε >= 0"):
        epsilon_for(0.95, 10)


@pytest.mark.parametrize("num_classes, epsilon", [(2, 2.2), (2, 0.5), (10, 3.0), (10, 1.0)])
def test_randomized_response_flip_rate(num_classes: int, epsilon: float) -> None:
    n = 200_000
    labels = np.random.default_rng(1).integers(0, num_classes, n)
    p = flip_probability(epsilon, num_classes)
    noisy = randomized_response(labels, num_classes, p, np.random.default_rng(7))
    flipped = noisy != labels
    assert abs(flipped.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    # A flipped label is uniform over the K − 1 others: each has probability p/(K − 1).
    offsets = (noisy[flipped] - labels[flipped]) % num_classes
    counts = np.bincount(offsets, minlength=num_classes)
    assert counts[0] == 0
    share = p / (num_classes - 1)
    assert np.all(np.abs(counts[1:] / n - share) < 5 * math.sqrt(share * (1 - share) / n))


def test_label_dp_perturbs_once_with_the_run_seed(tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp")
    setup = setup_for(cfg, num_classes=10, width=4)
    objective = build_objective("label_dp", {"epsilon": 1.0}, setup)
    ids = np.arange(40)
    first = objective.targets(ids, torch.from_numpy(setup.labels[ids]))
    objective.train_step(*batch(setup))
    assert torch.equal(objective.targets(ids, torch.from_numpy(setup.labels[ids])), first)
    same = build_objective("label_dp", {"epsilon": 1.0}, setup)
    assert torch.equal(same.noisy_labels, objective.noisy_labels)
    other = build_objective("label_dp", {"epsilon": 1.0}, setup_for(cfg, 10, 4, seed=1))
    assert not torch.equal(other.noisy_labels, objective.noisy_labels)
    summary = objective.summary()
    assert summary["epsilon"] == 1.0
    assert summary["flip_probability"] == pytest.approx(9 / (math.e + 9))
    train = setup.train_ids
    realised = float((objective.noisy_labels[train].numpy() != setup.labels[train]).mean())
    assert summary["realised_flip_rate"] == pytest.approx(realised)
    by_p = build_objective("label_dp", {"flip_probability": 0.1}, setup_for(cfg, 2, 4))
    assert by_p.summary()["epsilon"] == pytest.approx(math.log(9))


@pytest.mark.parametrize("num_classes, flip", [(2, 0.999), (2, 0.51), (3, 0.9)])
def test_label_dp_flip_probability_above_k_minus_1_over_k_is_refused_before_start(
        tmp_path: Path, num_classes: int, flip: float) -> None:
    cfg = config(tmp_path, top="mlp", objective={"name": "label_dp", "flip_probability": flip})
    allowed = rf"allowed: 0 < flip_probability ≤ {(num_classes - 1) / num_classes:.6g}"
    with pytest.raises(ConfigError, match=rf"objective\.flip_probability = {flip}.*{allowed}"):
        check_chain(cfg, num_classes)  # what `splitleak validate` runs
    with pytest.raises(ConfigError, match=allowed):
        build_objective("label_dp", {"flip_probability": flip}, setup_for(cfg, num_classes, 4))
    edge = build_objective("label_dp", {"flip_probability": (num_classes - 1) / num_classes},
                           setup_for(cfg, num_classes, 4))
    assert edge.summary()["epsilon"] == pytest.approx(0.0, abs=1e-9)


# --- KD^k ----------------------------------------------------------------------------------


@HYPOTHESIS
@given(st.integers(2, 12).flatmap(lambda c: st.tuples(
    st.just(c), st.integers(2, c), st.floats(0.01, 0.99), st.integers(0, 10_000))))
def test_kdk_soft_labels(case: tuple[int, int, float, int]) -> None:
    num_classes, k, epsilon, seed = case
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(16, num_classes, generator=gen) * 3, dim=1)
    labels = torch.randint(0, num_classes, (16,), generator=gen)
    soft = kdk_soft_labels(probs, labels, k, epsilon)
    assert torch.allclose(soft.sum(1), torch.ones(16), atol=1e-6)
    assert torch.allclose(soft[torch.arange(16), labels], torch.full((16,), 1 - epsilon))
    for row in range(16):
        others = [c for c in range(num_classes) if c != labels[row]]
        chosen = sorted(others, key=lambda c: -float(probs[row, c]))[: k - 1]
        for c in others:
            expected = epsilon / (k - 1) if c in chosen else 0.0
            assert float(soft[row, c]) == pytest.approx(expected, abs=1e-7)
        assert int((soft[row] > 0).sum()) == k


def test_kdk_true_class_in_the_teachers_top_k() -> None:
    # Teacher ranking 3 > 1 > 0 > 2 > 4; k = 3, ε = 0.3.
    probs = torch.tensor([[0.2, 0.3, 0.05, 0.4, 0.05]]).repeat(3, 1)
    soft = kdk_soft_labels(probs, torch.tensor([3, 1, 4]), k=3, epsilon=0.3)
    expected = torch.tensor([
        [0.15, 0.15, 0.0, 0.7, 0.0],  # truth = top-1: the next two (1, 0)
        [0.15, 0.7, 0.0, 0.15, 0.0],  # truth = top-2: the others of the top 3 (3, 0)
        [0.0, 0.15, 0.0, 0.15, 0.7],  # truth outside the top 3: the teacher's top 2 (3, 1)
    ])
    assert torch.allclose(soft, expected)
    with pytest.raises(ValueError, match="k = 6"):
        kdk_soft_labels(probs, torch.tensor([3, 1, 4]), k=6, epsilon=0.3)


def test_kdk_soft_labels_arazzi_rule() -> None:
    # The paper's eq. (9) / Algorithm 1: 1 − ε on the teacher's top class, ε/(k − 1) on its next
    # k − 1, whatever the true class; ours gives 1 − ε to the true class.
    probs = torch.tensor([[0.6, 0.3, 0.05, 0.05]])
    truth = torch.tensor([1])
    ours = kdk_soft_labels(probs, truth, k=3, epsilon=0.45)
    assert torch.allclose(ours, torch.tensor([[0.225, 0.55, 0.225, 0.0]]))
    paper = kdk_soft_labels(probs, truth, k=3, epsilon=0.45, rule="arazzi")
    assert torch.allclose(paper, torch.tensor([[0.55, 0.225, 0.0, 0.225]]))
    gen = torch.Generator().manual_seed(0)
    many = torch.softmax(torch.randn(32, 6, generator=gen) * 3, dim=1)
    labels = torch.randint(0, 6, (32,), generator=gen)
    soft = kdk_soft_labels(many, labels, k=4, epsilon=0.3, rule="arazzi")
    top = many.topk(4, dim=1).indices
    assert torch.allclose(soft.gather(1, top[:, :1]), torch.full((32, 1), 0.7))
    assert torch.allclose(soft.gather(1, top[:, 1:]), torch.full((32, 3), 0.1))
    assert torch.equal(soft, kdk_soft_labels(many, torch.zeros(32, dtype=torch.int64), 4, 0.3,
                                             rule="arazzi"))  # the truth is not used
    with pytest.raises(ValueError, match="allowed: 'true_class', 'arazzi'"):
        kdk_soft_labels(probs, truth, k=3, epsilon=0.45, rule="paper")
    with pytest.raises(ValidationError, match="'true_class' or 'arazzi'"):
        KDkParams.model_validate({"soft_labels": "paper"})
    assert KDkParams().soft_labels == "true_class"


def test_kdk_k_above_the_class_count_names_the_range_the_field_allows(tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp", label_party=True, objective={"name": "kdk", "k": 4})
    with pytest.raises(ConfigError, match=r"objective\.k = 4 exceeds the 3 classes .*allowed: 2\.\.3$"):
        check_chain(cfg, 3)
    with pytest.raises(ValidationError, match="greater than or equal to 2"):
        KDkParams.model_validate({"k": 1})  # so 1..K, as the message said, was never allowed


def test_kdk_needs_the_label_partys_features(tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp", objective={"name": "kdk"})
    with pytest.raises(ConfigError, match=r"features\.label_party"):
        KDk.check(cfg)
    with pytest.raises(ConfigError, match=r"features\.label_party"):
        build_objective("kdk", {}, setup_for(cfg, 10, 4))
    with_features = config(tmp_path, top="mlp", label_party=True)
    KDk.check(with_features)
    with pytest.raises(ConfigError, match=r"features\.label_party"):  # declared but not loaded
        build_objective("kdk", {}, setup_for(with_features, 10, 4, own=False))


def test_kdk_targets_come_from_the_teacher(tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp", label_party=True)
    setup = setup_for(cfg, num_classes=4, width=4, own=True)
    params = {"k": 3, "epsilon": 0.45, "teacher_epochs": 30, "teacher_lr": 0.01}
    objective = build_objective("kdk", params, setup)
    train = setup.train_ids
    soft = objective.targets(train, torch.from_numpy(setup.labels[train]))
    assert soft.shape == (train.size, 4)
    assert torch.allclose(soft[torch.arange(train.size), torch.from_numpy(setup.labels[train])],
                          torch.full((train.size,), 0.55))
    assert torch.allclose(soft.sum(1), torch.ones(train.size))
    summary = objective.summary()
    assert summary["teacher_train_accuracy"] > 0.5  # the first own column separates the classes
    assert summary["k"] == 3 and summary["epsilon"] == 0.45 and summary["teacher_epochs"] == 30
    again = build_objective("kdk", params, setup)
    assert torch.equal(again.soft_targets, objective.soft_targets)
    with pytest.raises(ConfigError, match="k = 5"):
        build_objective("kdk", {**params, "k": 5}, setup)


def test_kdk_softmax_target_is_eq_10_as_written(tmp_path: Path) -> None:
    """Arazzi et al.'s eq. (10) trains against SM(SL); the default keeps SL itself."""
    cfg = config(tmp_path, top="mlp", label_party=True)
    setup = setup_for(cfg, num_classes=4, width=4, own=True)
    params = {"k": 3, "epsilon": 0.45, "teacher_epochs": 2, "teacher_lr": 0.01}
    ours = build_objective("kdk", params, setup)
    paper = build_objective("kdk", {**params, "target": "softmax"}, setup)
    train = setup.train_ids
    y = torch.from_numpy(setup.labels[train])
    assert torch.allclose(paper.targets(train, y), torch.softmax(ours.targets(train, y), dim=1))
    assert paper.summary()["target"] == "softmax of the soft-label vector (soft-target CE)"
    assert ours.summary()["target"] == "soft-label vector (soft-target CE)"
    assert paper.train_step(*batch(setup)).loss != ours.train_step(*batch(setup)).loss
    with pytest.raises(ValidationError):
        KDkParams.model_validate({"target": "sm"})
    assert KDkParams().target == "soft_labels"


def test_kdk_binary(tmp_path: Path) -> None:
    params = {"k": 2, "epsilon": 0.2, "teacher_epochs": 1}
    bce = config(tmp_path, top="mlp", label_party=True)
    setup = setup_for(bce, 2, 4, own=True)
    objective = build_objective("kdk", params, setup)
    ids = setup.train_ids
    target = objective.targets(ids, torch.from_numpy(setup.labels[ids]))
    assert target.shape == (ids.size,)  # BCE: P(class 1) of the soft label
    assert torch.allclose(target, torch.from_numpy(np.where(setup.labels[ids] == 1, 0.8, 0.2)).float())
    with pytest.raises(ConfigError, match="k = 3 exceeds the 2 classes"):
        build_objective("kdk", {**params, "k": 3}, setup)
    ce = config(tmp_path, top="mlp", label_party=True, loss="ce")
    setup = setup_for(ce, 2, 4, own=True)
    objective = build_objective("kdk", params, setup)
    target = objective.targets(ids, torch.from_numpy(setup.labels[ids]))
    assert target.shape == (ids.size, 2)  # two logits: the soft-label vector
    result = objective.train_step(*batch(setup))
    assert math.isfinite(result.loss)


# --- GAFM ----------------------------------------------------------------------------------


def test_gafm_presets_and_overrides() -> None:
    assert PRESETS == {"spambase": (0.01, 0.05, 1.0), "imdb": (0.01, 0.1, 1.0),
                       "criteo": (0.01, 0.5, 1.0), "isic": (0.01, 0.05, 20.0)}
    for name, values in PRESETS.items():
        assert GAFMParams(preset=name).resolved() == values
    assert GAFMParams(preset="isic", delta=0.2).resolved() == (0.01, 0.2, 20.0)
    assert GAFMParams().resolved() == PRESETS["spambase"]


def test_gafm_soft_labels() -> None:
    labels = torch.tensor([0, 1] * 5000)
    soft = soft_labels(labels, 0.2, torch.Generator().manual_seed(0))
    pos, neg = soft[labels == 1], soft[labels == 0]
    assert pos.min() >= 0.5 and pos.max() <= 0.7 and neg.min() >= 0.3 and neg.max() <= 0.5
    assert float(pos.mean()) == pytest.approx(0.6, abs=0.005)  # u ~ U(0, Δ): E[Ỹ | Y=1] = 0.5 + Δ/2
    assert torch.equal(soft_labels(labels, 0.0, torch.Generator()), torch.full((10000,), 0.5))


def test_normalised_sum() -> None:
    a, b = torch.randn(16, 3), torch.randn(16, 3)
    out = normalised_sum(a, b, 2.0)
    assert torch.allclose(out, 2 * a / a.norm() + b / b.norm())
    assert torch.allclose(normalised_sum(torch.zeros(4, 1), b[:4, :1], 5.0), b[:4, :1] / b[:4, :1].norm())


def test_gafm_clips_every_critic_weight(tmp_path: Path) -> None:
    setup = setup_for(config(tmp_path), 2, 1)
    objective = build_objective("gafm", {"clip": 0.05, "critic_lr": 0.5}, setup)
    for step in range(3):
        acts, own, ids, y = batch(setup, seed=step)
        objective.train_step(acts, own, ids, y)
        weights = torch.cat([p.detach().reshape(-1) for p in objective.critic.parameters()])
        assert weights.abs().max() <= 0.05 + 1e-7
        assert (weights.abs() > 0.05 - 1e-6).any()  # a large step hits the bound: clipping acted


@pytest.mark.parametrize("aggregation, parties, gamma", [("sum", 2, 1.0), ("mean", 3, 20.0),
                                                          ("sum", 1, 3.0)])
def test_gafm_sends_the_normalised_combined_gradient(tmp_path: Path, aggregation: str,
                                                     parties: int, gamma: float) -> None:
    setup = setup_for(config(tmp_path), 2, width=1, parties=parties)
    objective: GAFM = build_objective("gafm", {"aggregation": aggregation, "gamma": gamma,
                                               "delta": 0.3, "sigma": 0.1}, setup)
    acts, own, ids, y = batch(setup)
    draws = torch.Generator()
    draws.set_state(objective.noise.get_state())
    result = objective.train_step(acts, own, ids, y)
    # Recompute both parts independently with the updated G and D and the same random draws.
    stacked = torch.stack([a.detach() for a in acts])
    f = (stacked.sum(0) if aggregation == "sum" else stacked.mean(0)).requires_grad_(True)
    real = y.float()[:, None] + 0.1 * torch.randn(len(ids), 1, generator=draws)
    u = torch.rand(len(ids), generator=draws) * 0.3
    soft = torch.where(y == 1, 0.5 + u, 0.5 - u)
    gan = objective.critic(real).mean() - objective.critic(objective.generator(f)).mean()
    (a,) = torch.autograd.grad(gan, f)
    (b,) = torch.autograd.grad(F.binary_cross_entropy_with_logits(f.sum(1), soft), f)
    expected = gamma * a / a.norm() + b / b.norm()
    scale = 1.0 if aggregation == "sum" else 1.0 / parties  # chain rule through the mean
    for gradient in result.gradients:
        assert torch.allclose(gradient, scale * expected, atol=1e-6)
    assert result.metrics["gafm.grad_norm_gan"] == pytest.approx(float(a.norm()), rel=1e-5)
    assert result.metrics["gafm.grad_norm_ce"] == pytest.approx(float(b.norm()), rel=1e-5)


def test_gafm_critic_ascends_and_generator_descends(tmp_path: Path) -> None:
    setup = setup_for(config(tmp_path), 2, width=1)
    objective: GAFM = build_objective("gafm", {"sigma": 0.1, "generator_lr": 1e-3,
                                               "critic_lr": 1e-3}, setup)
    acts, own, ids, y = batch(setup)
    critic, gen = copy.deepcopy(objective.critic), copy.deepcopy(objective.generator)
    draws = torch.Generator()
    draws.set_state(objective.noise.get_state())
    objective.train_step(acts, own, ids, y)
    f = torch.stack([a.detach() for a in acts]).sum(0)
    real = y.float()[:, None] + 0.1 * torch.randn(len(ids), 1, generator=draws)

    def gan(d, g) -> float:
        with torch.no_grad():
            return float(d(real).mean() - d(g(f)).mean())

    assert gan(objective.critic, gen) > gan(critic, gen)  # step 1: the critic ascends L_GAN
    assert gan(objective.critic, objective.generator) < gan(objective.critic, gen)  # step 2


def test_gafm_predicts_logit_of_the_generator_output(tmp_path: Path) -> None:
    setup = setup_for(config(tmp_path), 2, 1)
    objective: GAFM = build_objective("gafm", {}, setup)
    acts, own, ids, _ = batch(setup)
    f = torch.stack([a.detach() for a in acts]).sum(0)
    with torch.no_grad():
        y_hat = objective.generator(f)
    assert torch.allclose(objective.predict(acts, own), torch.logit(y_hat), atol=1e-4)
    objective.orientation_statistic = -0.1  # training batches say Ŷ falls with Y: logit(1 − Ŷ)
    assert torch.allclose(objective.predict(acts, own), torch.logit(1 - y_hat), atol=1e-4)
    fixed: GAFM = build_objective("gafm", {"orientation": "as_is"}, setup)
    fixed.orientation_statistic = -0.1
    with torch.no_grad():
        assert torch.allclose(fixed.predict(acts, own), torch.logit(fixed.generator(f)), atol=1e-4)


def test_gafm_orientation_follows_the_training_batches(tmp_path: Path) -> None:
    setup = setup_for(config(tmp_path), 2, 1)
    objective: GAFM = build_objective("gafm", {"orientation_decay": 0.0}, setup)
    labels = torch.tensor([0, 0, 1, 1])
    objective._track_orientation(torch.tensor([0.9, 0.8, 0.1, 0.2]), labels)
    assert objective.orientation == -1
    objective._track_orientation(torch.tensor([0.1, 0.2, 0.9, 0.8]), labels)
    assert objective.orientation == 1 and objective.orientation_changes == 2
    objective._track_orientation(torch.tensor([0.9, 0.9, 0.1, 0.1]), torch.ones(4, dtype=torch.long))
    assert objective.orientation == 1  # a one-class batch says nothing


@pytest.mark.parametrize("overrides, num_classes, message", [
    ({"top": "mlp"}, 2, r"model\.top = 'none'"),
    ({"label_party": True}, 2, r"features\.label_party"),
    ({"loss": "ce"}, 2, r"training\.loss"),
    ({}, 10, "binary"),
])
def test_gafm_config_errors(tmp_path: Path, overrides: dict, num_classes: int, message: str) -> None:
    cfg = config(tmp_path, **overrides)
    if num_classes == 2:
        with pytest.raises(ConfigError, match=message):
            GAFM.check(cfg)
    with pytest.raises(ConfigError, match=message):
        build_objective("gafm", {}, setup_for(cfg, num_classes, 1, own=overrides.get("label_party", False)))


def test_gafm_refuses_unequal_party_outputs(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    setup = setup_for(cfg, 2, 1)
    uneven = ObjectiveSetup(**{**setup.__dict__, "activation_shapes": [(1,), (2,)]})
    with pytest.raises(ConfigError, match="one shape"):
        build_objective("gafm", {}, uneven)


def test_delta_selection_names_its_subsets_as_given() -> None:
    """--fraction 0.001 printed '1 random 0% subsets' (and 0.125 '12%'), not saying that the
    subsets came to 2 train rows each."""
    from orchestration.gafm_select import DeltaSelection, DeltaTrial, subsets

    def selection(fraction: float, rows: list[int]) -> DeltaSelection:
        trials = [DeltaTrial(0.1, r, r, n, 0.9, 0.8, None) for r, n in enumerate(rows)]
        return DeltaSelection(0.1, {0.1: 1.1}, trials, fraction, len(rows), ("norm",), 0)

    assert subsets(selection(0.001, [2])) == "1 random 0.1% subset (2 train rows each)"
    assert subsets(selection(0.125, [53, 54])) == "2 random 12.5% subsets (53-54 train rows each)"
    assert subsets(selection(0.1, [43] * 5)) == "5 random 10% subsets (43 train rows each)"


def test_delta_selection_arguments(tmp_path: Path) -> None:
    ids = np.arange(1000)
    picked = subset_ids(ids, 0.1, np.random.default_rng(0))
    assert picked.size == 100 and np.unique(picked).size == 100
    with pytest.raises(ConfigError, match="gafm"):
        select_delta(config(tmp_path))
    gafm = config(tmp_path, objective={"name": "gafm"})
    with pytest.raises(ConfigError, match="attacks"):
        select_delta(gafm, attacks=("cosine",))
    with pytest.raises(ConfigError, match="0.5"):
        select_delta(gafm, deltas=(0.7,))
    with pytest.raises(ConfigError, match=r"deltas repeat \[0.1\]"):
        select_delta(gafm, deltas=(0.1, 0.2, 0.1))


def test_activation_gradients_name_an_activation_outside_the_loss() -> None:
    used, unused = torch.ones(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    (used * 2).sum().backward()
    with pytest.raises(RuntimeError, match=r"activations \[1\] took no part"):
        activation_gradients([used, unused])
    assert torch.equal(activation_gradients([used])[0], torch.full((2, 3), 2.0))
