"""The other benchmarks' objective defenses (MID, dCor, PELoss, CAE) and the per-class gradients
the trainer computes for GradPerturb."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from label_party.objectives import OBJECTIVES, build_objective, pairwise, supervised_loss
from label_party.objectives.cae import CAEParams, train_autoencoder
from label_party.objectives.dcor import distance_correlation
from label_party.objectives.pe_loss import potential_energy
from label_party.schedule import Batch, Phase
from label_party.trainer import LabelPartyTrainer
from label_party.validate import check_chain
from splitleak.config import ConfigError, parse_config
from tests.conftest import small_config
from tests.test_objectives import PARAMS, batch, config, objective_case, setup_for

NEW = ["mid", "dcor", "pe_loss", "cae"]
PER_CLASS = sorted(n for n in OBJECTIVES.names() if OBJECTIVES.get(n).supports_class_gradients)


# --- edge batches ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize(("size", "width", "one_class"), [(1, 4, False), (6, 4, True), (32, 1, False)],
                         ids=["batch-of-1", "one-class", "width-1"])
def test_edge_batches(name: str, size: int, width: int, one_class: bool, tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp")
    setup = setup_for(cfg, 2, width=width)
    objective = build_objective(name, PARAMS[name], setup)
    acts, own, ids, y = batch(setup, size=size)
    if one_class:
        y = torch.ones_like(y)
    result = objective.train_step(acts, own, ids, y, class_gradients=True)
    assert math.isfinite(result.loss)
    for gradient, per_class, act in zip(result.gradients, result.class_gradients, acts, strict=True):
        assert gradient.shape == act.shape and torch.isfinite(gradient).all()
        assert per_class.shape == (2, *act.shape) and torch.isfinite(per_class).all()
    logits = objective.predict([a.detach() for a in acts], own)
    assert logits.shape == (size, 1) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NEW)
def test_multiclass_and_three_parties(name: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp", loss="ce")
    setup = setup_for(cfg, 5, width=3, parties=3)
    objective = build_objective(name, PARAMS[name], setup)
    acts, own, ids, y = batch(setup, size=40)
    result = objective.train_step(acts, own, ids, y)
    assert len(result.gradients) == 3 and all(torch.isfinite(g).all() for g in result.gradients)
    assert objective.predict([a.detach() for a in acts], own).shape == (40, 5)


# --- per-class gradients (GradPerturb) -------------------------------------------------------


@pytest.mark.parametrize("loss", ["bce", "ce"])
@pytest.mark.parametrize("name", [n for n in PER_CLASS if n != "mid"])
def test_class_gradients_are_the_gradients_with_every_label_set_to_c(
        name: str, loss: str, tmp_path: Path) -> None:
    cfg, setup = objective_case(name, tmp_path, num_classes=3 if loss == "ce" else 2)
    if loss == "ce":
        cfg = config(tmp_path, top="mlp", label_party=name == "kdk", loss="ce")
        setup = setup_for(cfg, 3, width=4, own=name == "kdk")
    asked = build_objective(name, PARAMS[name], setup)
    fresh = build_objective(name, PARAMS[name], setup)  # same seed: the same parameters
    plain = build_objective(name, PARAMS[name], setup)
    acts, own, ids, y = batch(setup)
    result = asked.train_step(acts, own, ids, y, class_gradients=True)
    classes = 2 if loss == "bce" else 3
    twins = [a.detach().clone().requires_grad_(True) for a in acts]
    logits = fresh.logits(twins, own, training=True)  # before any update, as the real step
    targets = fresh.class_targets(len(ids))
    for c in range(classes):
        manual = torch.autograd.grad(supervised_loss(logits, targets[c], fresh.loss_kind), twins,
                                     retain_graph=True)
        for party, expected in enumerate(manual):
            assert torch.allclose(result.class_gradients[party][c], expected, atol=1e-7, rtol=1e-5)
    # Asking for them changes nothing else.
    again = plain.train_step([a.detach().clone().requires_grad_(True) for a in acts], own, ids, y)
    assert again.class_gradients is None
    for a, b in zip(result.gradients, again.gradients, strict=True):
        assert torch.equal(a, b)
    assert result.loss == again.loss


def test_class_gradients_of_the_label_party_step(tmp_path: Path) -> None:
    """The trainer computes them only for a chain that reads them, and grad_perturb gets them."""
    data = small_config(tmp_path, dataset={"name": "digits", "test_fraction": 0.25},
                        features={"passive": [[0, 4], [4, 8]]}, training={"loss": "ce"})
    labels = np.arange(60) % 10
    shapes = {1: (8,), 2: (8,)}
    plain = LabelPartyTrainer(parse_config(data), labels, 10, shapes)
    assert not plain.class_gradients
    perturbed = LabelPartyTrainer(parse_config({**data, "defense": [
        {"name": "grad_perturb", "epsilon": 1e6}]}), labels, 10, shapes)
    assert perturbed.class_gradients
    gen = torch.Generator().manual_seed(0)
    acts = {k: torch.randn(60, 8, generator=gen) for k in shapes}
    step = Batch(Phase.TRAIN, 0, 0, np.arange(60))
    clean, _ = plain.train_step(step, acts)
    noisy, record = perturbed.train_step(step, acts)
    for k in shapes:  # ε = 1e6: Laplace weights of scale 2e-6, a tiny perturbation
        assert not torch.equal(clean[k], noisy[k])
        assert torch.allclose(clean[k], noisy[k], atol=1e-5)
    assert record["defense.1"]["grad_perturb.noise_norm_mean"] > 0


def test_grad_perturb_needs_an_objective_with_class_gradients(tmp_path: Path) -> None:
    gafm = config(tmp_path, objective={"name": "gafm"}, defense=[{"name": "grad_perturb",
                                                                   "epsilon": 1.0}])
    with pytest.raises(ConfigError, match=r"defense grad_perturb needs the per-class gradients.*"
                                          r"objective 'gafm' has none.*allowed objectives: cae, "):
        check_chain(gafm)
    for name in PER_CLASS:
        objective = {"name": name, **PARAMS[name]}
        check_chain(config(tmp_path, top="mlp", label_party=name == "kdk", objective=objective,
                           defense=[{"name": "grad_perturb", "epsilon": 1.0}]))


# --- MID -------------------------------------------------------------------------------------


def mid_case(tmp_path: Path, **params):
    cfg = config(tmp_path, top="mlp")
    setup = setup_for(cfg, 2, width=4)
    return build_objective("mid", {"lambda": 0.1, **params}, setup), setup


def test_mid_penalty_is_lambda_times_the_gaussian_kl(tmp_path: Path) -> None:
    objective, setup = mid_case(tmp_path, width=3)
    acts, _, _, y = batch(setup)
    penalty, metrics = objective.penalty(acts, y)
    expected = 0.0
    for bottleneck, act in zip(objective.bottlenecks, acts, strict=True):
        mu, sigma = bottleneck.encode(act)
        assert mu.shape == (32, 3)
        expected += kl_divergence(Normal(mu, sigma), Normal(0.0, 1.0)).sum(1).mean()
    assert torch.allclose(penalty, 0.1 * expected)
    assert metrics["mid.kl.party_1"] > 0
    zero, _ = build_objective("mid", {"lambda": 0.0}, setup).penalty(acts, y)
    assert float(zero.detach()) == 0.0


def test_mid_samples_in_training_and_decodes_the_mean_in_evaluation(tmp_path: Path) -> None:
    objective, setup = mid_case(tmp_path)
    acts, own, ids, y = batch(setup)
    state = objective.noise.get_state()
    first = objective.predict([a.detach() for a in acts], own)
    assert torch.equal(first, objective.predict([a.detach() for a in acts], own))
    assert torch.equal(state, objective.noise.get_state())  # evaluation draws no noise
    sampled = [objective.logits([a.detach() for a in acts], own, training=True) for _ in "ab"]
    assert not torch.equal(sampled[0], sampled[1]) and not torch.equal(sampled[0], first)
    summary = objective.summary()
    assert summary["lambda"] == 0.1 and summary["width"] == [4, 4] and summary["hidden"] == [20, 20]


def test_mid_gradient_goes_through_the_bottleneck(tmp_path: Path) -> None:
    objective, setup = mid_case(tmp_path)
    acts, own, ids, y = batch(setup)
    bottleneck = objective.bottlenecks[0]
    weight = bottleneck.encoder.weight.detach().clone()
    result = objective.train_step(acts, own, ids, y)
    assert not torch.equal(weight, bottleneck.encoder.weight)  # the bottleneck trains
    assert result.metrics["mid.supervised_loss"] < result.loss  # loss = CE + λ·KL


# --- dCor ------------------------------------------------------------------------------------


def reference_dcor(x: np.ndarray, labels: np.ndarray) -> float:
    """Székely's V-statistic with the full double-centred matrices (the O(B²) textbook form)."""
    def centred(m: np.ndarray) -> np.ndarray:
        return m - m.mean(0) - m.mean(1)[:, None] + m.mean()

    a = centred(np.linalg.norm(x[:, None] - x[None], axis=-1))
    onehot = np.eye(labels.max() + 1)[labels]
    b = centred(np.linalg.norm(onehot[:, None] - onehot[None], axis=-1))
    return math.sqrt((a * b).mean() / math.sqrt((a * a).mean() * (b * b).mean()))


def test_dcor_matches_the_textbook_statistic(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (50,), generator=gen)
    h = torch.randn(50, 2, 3, generator=gen) + labels[:, None, None] * 0.5
    expected = reference_dcor(h.reshape(50, -1).double().numpy(), labels.numpy())
    assert float(distance_correlation(h, labels)) == pytest.approx(expected, rel=1e-5)
    assert float(distance_correlation(h, labels, squared=True)) == pytest.approx(expected**2, rel=1e-5)
    assert float(distance_correlation(h * 100.0, labels)) == pytest.approx(expected, rel=1e-5)
    onehot = torch.eye(3)[labels]
    assert float(distance_correlation(onehot, labels)) == pytest.approx(1.0)
    # Row blocks of 7 rows (recomputed in backward) give the same value and gradient.
    leaf = h.clone().requires_grad_(True)
    (whole,) = torch.autograd.grad(distance_correlation(leaf, labels), leaf)
    monkeypatch.setattr(pairwise, "BLOCK_ENTRIES", 7 * 50)
    blocked_value = distance_correlation(leaf, labels)
    (blocked,) = torch.autograd.grad(blocked_value, leaf)
    assert blocked_value.item() == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(whole, blocked, atol=1e-7)


def test_dcor_edge_cases() -> None:
    h = torch.randn(8, 4, requires_grad=True)
    assert float(distance_correlation(h, torch.zeros(8, dtype=torch.int64))) == 0.0  # one class
    assert float(distance_correlation(h[:1], torch.tensor([1]))) == 0.0  # one row
    assert float(distance_correlation(torch.ones(8, 4), torch.arange(8) % 2)) == 0.0  # constant
    twins = torch.cat([h[:4], h[:4]]).detach().requires_grad_(True)  # duplicated rows
    (gradient,) = torch.autograd.grad(distance_correlation(twins, torch.arange(8) % 2), twins)
    assert torch.isfinite(gradient).all()


def test_dcor_training_lowers_the_correlation(tmp_path: Path) -> None:
    """Descending α·dCor on the activations themselves makes them less label-dependent."""
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 2, (64,), generator=gen)
    h = (torch.randn(64, 4, generator=gen) + 2.0 * labels[:, None]).requires_grad_(True)
    before = float(distance_correlation(h, labels).detach())
    optimizer = torch.optim.SGD([h], lr=5.0)
    for _ in range(60):
        optimizer.zero_grad()
        distance_correlation(h, labels).backward()
        optimizer.step()
    assert float(distance_correlation(h, labels).detach()) < before - 0.3


# --- PELoss ----------------------------------------------------------------------------------


def reference_energy(x: np.ndarray, labels: np.ndarray, softening: float, angular: bool) -> float:
    x = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)  # layer norm
    if angular:
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        distance = np.arccos(np.clip(unit @ unit.T, -1 + 1e-7, 1 - 1e-7))
    else:
        distance = np.linalg.norm(x[:, None] - x[None], axis=-1)
    same = (labels[:, None] == labels[None]) & ~np.eye(len(labels), dtype=bool)
    return float((1.0 / np.sqrt(distance**2 + softening**2))[same].mean())


@pytest.mark.parametrize("distance", ["euclidean", "angular"])
def test_pe_loss_matches_the_formula(distance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 3, (40,), generator=gen)
    h = torch.randn(40, 6, generator=gen)
    expected = reference_energy(h.double().numpy(), labels.numpy(), 1e-3, distance == "angular")
    leaf = h.clone().requires_grad_(True)
    value = potential_energy(leaf, labels, distance)
    assert value.item() == pytest.approx(expected, rel=1e-5)
    (whole,) = torch.autograd.grad(value, leaf)
    monkeypatch.setattr(pairwise, "BLOCK_ENTRIES", 3 * 40)
    blocked_value = potential_energy(leaf, labels, distance)
    (blocked,) = torch.autograd.grad(blocked_value, leaf)
    assert blocked_value.item() == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(whole, blocked, atol=1e-6)
    # Layer normalisation: the scale of the activations does not change the energy.
    assert float(potential_energy(h * 10.0, labels, distance)) == pytest.approx(expected, rel=1e-4)


def test_pe_loss_spreads_each_class_apart() -> None:
    gen = torch.Generator().manual_seed(3)
    labels = torch.arange(30) % 2
    h = (torch.randn(30, 5, generator=gen) * 0.1 + 3.0 * torch.eye(5)[labels]).requires_grad_(True)
    def spread(x: torch.Tensor) -> float:  # mean distance between same-class rows (layer-normed)
        x = torch.nn.functional.layer_norm(x.detach(), x.shape[1:])
        d = torch.cdist(x, x)
        same = (labels[:, None] == labels[None]) & ~torch.eye(30, dtype=torch.bool)
        return float(d[same].mean())
    before_energy, before_spread = potential_energy(h, labels).item(), spread(h)
    optimizer = torch.optim.SGD([h], lr=0.5)
    for _ in range(20):
        optimizer.zero_grad()
        potential_energy(h, labels).backward()
        optimizer.step()
    assert potential_energy(h, labels).item() < before_energy and spread(h) > 2 * before_spread


def test_pe_loss_edge_cases() -> None:
    h = torch.randn(5, 3, requires_grad=True)
    assert float(potential_energy(h, torch.arange(5))) == 0.0  # no two rows share a label
    assert float(potential_energy(h[:1], torch.tensor([0]))) == 0.0
    zeros = torch.zeros(4, 3, requires_grad=True)  # coincident rows (dead ReLUs)
    value = potential_energy(zeros, torch.zeros(4, dtype=torch.int64))
    (gradient,) = torch.autograd.grad(value, zeros)
    assert value.item() == pytest.approx(1e3) and torch.isfinite(gradient).all()


# --- CAE -------------------------------------------------------------------------------------


@pytest.mark.parametrize("classes", [2, 4])
def test_cae_confuses_the_soft_labels_and_decodes_them_back(classes: int) -> None:
    model, losses = train_autoencoder(classes, CAEParams.model_validate(
        {"lambda": 0.5, "epochs": 10, "rows": 6000}), seed=0)
    assert losses[-1] < losses[0]
    with torch.no_grad():
        soft = model.encode(torch.eye(classes))
        decoded = model.decoder(soft).argmax(1)
    assert torch.allclose(soft.sum(1), torch.ones(classes))
    assert torch.equal(decoded, torch.arange(classes))  # D recovers every label
    assert (soft.argmax(1) != torch.arange(classes)).all()  # E puts it elsewhere
    assert float(soft.diagonal().max()) < 0.2


def test_cae_entropy_grows_with_lambda() -> None:
    def entropy(lam: float) -> float:
        model, _ = train_autoencoder(4, CAEParams.model_validate(
            {"lambda": lam, "epochs": 10, "rows": 6000}), seed=1)
        with torch.no_grad():
            soft = model.encode(torch.eye(4))
        return float(-(soft * soft.log()).sum(1).mean())
    assert entropy(0.0) < entropy(1.0) < entropy(4.0)


@pytest.mark.parametrize("loss", ["bce", "ce"])
def test_cae_trains_on_soft_labels_and_predicts_through_the_decoder(loss: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, top="mlp", loss=loss)
    setup = setup_for(cfg, 2, width=4)
    objective = build_objective("cae", PARAMS["cae"], setup)
    acts, own, ids, y = batch(setup)
    soft = objective.soft_labels[y]
    targets = objective.targets(ids, y)
    assert torch.equal(targets, soft[:, 1] if loss == "bce" else soft)
    logits = objective.logits([a.detach() for a in acts], own, training=False)
    probs = torch.stack([1 - torch.sigmoid(logits[:, 0]), torch.sigmoid(logits[:, 0])], 1) \
        if loss == "bce" else torch.softmax(logits, 1)
    decoded = torch.softmax(objective.autoencoder.decoder(probs), 1)
    predicted = objective.predict([a.detach() for a in acts], own)
    if loss == "bce":
        assert predicted.shape == (32, 1)
        assert torch.allclose(torch.sigmoid(predicted[:, 0]), decoded[:, 1], atol=1e-6)
    else:
        assert torch.allclose(torch.softmax(predicted, 1), decoded, atol=1e-6)
    summary = objective.summary()
    assert summary["lambda"] == 0.5 and summary["hidden"] == 14 and summary["seed"] == 0


# --- state: continue bit for bit -------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_state_dict_round_trip_continues_bit_for_bit(name: str, tmp_path: Path) -> None:
    cfg, setup = objective_case(name, tmp_path)
    original = build_objective(name, PARAMS[name], setup)
    for step in range(2):
        original.train_step(*batch(setup, seed=step))
    state = original.state_dict()
    resumed = build_objective(name, PARAMS[name], setup_for(cfg, 2, width=4, seed=0))
    resumed.load_state_dict(state)
    acts, own, ids, y = batch(setup, seed=9)
    twins = [a.detach().clone().requires_grad_(True) for a in acts]
    expected = original.train_step(acts, own, ids, y)
    got = resumed.train_step(twins, own, ids, y)
    assert expected.loss == got.loss
    for a, b in zip(expected.gradients, got.gradients, strict=True):
        assert torch.equal(a, b)
