"""Gradient defenses: conformance of every plug-in, statistics of the noise, Marvell's solver."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy.optimize import minimize, minimize_scalar
from sklearn.metrics import roc_auc_score

from attacker.report.report import _defense_md
from label_party.defenses import DEFENSES, DefenseChain, DefenseContext, build_defense, chain_summaries
from label_party.defenses.bench_marvell import time_marvell
from label_party.defenses.chain import defense_generator
from label_party.defenses.dp_gaussian import EPSILON_COVERS
from label_party.defenses.marvell import auc_bound
from label_party.defenses.marvell_solver import objective, solve
from label_party.defenses.sparsify import kept_count
from splitleak.artifacts.artifact import finite_or_null
from splitleak.registry import UnknownPluginError

# One valid parameter set per registered defense; the conformance tests run all of them.
PARAMS: dict[str, dict] = {
    "no_noise": {},
    "max_norm": {},
    "iso": {"t": 1.0},
    "perp": {},
    "marvell": {"s": 1.0},
    "dp_gaussian": {"clip": 1.0, "noise_multiplier": 1.0},
    "laplace": {"b": 0.1},
    "sparsify": {"kept_fraction": 0.5},
    "discrete_sgd": {"bins": 6},
    "ppdl": {"theta_u": 0.5},
    "grad_perturb": {"epsilon": 1.0},
}
RANDOMISED = ["max_norm", "iso", "perp", "marvell", "dp_gaussian", "laplace", "ppdl", "grad_perturb"]
HYPOTHESIS = settings(deadline=None, max_examples=40, derandomize=True)


def context(labels: torch.Tensor, seed: int = 0, epoch: int = 0, step: int = 0,
            class_gradients: torch.Tensor | None = None) -> DefenseContext:
    return DefenseContext(
        labels=labels,
        party_id=1,
        epoch=epoch,
        step=step,
        num_classes=2,
        generator=torch.Generator().manual_seed(seed),
        class_gradients=class_gradients,
    )


def binary_class_gradients(gradient: torch.Tensor) -> torch.Tensor:
    """[2, B, *shape] stand-ins for "the gradient if the label were 0 / 1" (BCE-like: one row
    scaled two ways); a defense that reads them gets them, the rest ignore them."""
    return torch.stack([0.5 * gradient + 0.25, -0.5 * gradient]).to(gradient.dtype)


def two_class_batch(batch: int = 32, shape: tuple[int, ...] = (8,), seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.arange(batch) % 4 == 0).long()  # 25 % positives, both classes when B ≥ 2
    gradient = torch.randn(batch, *shape, generator=gen)
    gradient += labels.view(-1, *[1] * len(shape)).float()  # positives shifted: Δg ≠ 0
    return gradient, labels


def run(name: str, gradient: torch.Tensor, labels: torch.Tensor, seed: int = 0, **params):
    defense = build_defense(name, {**PARAMS[name], **params})
    per_class = binary_class_gradients(gradient) if defense.needs_class_gradients else None
    ctx = context(labels, seed, class_gradients=per_class)
    return defense(gradient, ctx), ctx, defense


# --------------------------------------------------------------------------- conformance


def test_every_registered_defense_has_conformance_params() -> None:
    assert sorted(PARAMS) == DEFENSES.names()


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(16,), (3, 4, 5)])
def test_conformance(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gradient, labels = two_class_batch(24, shape)
    gradient = gradient.to(dtype)
    before = gradient.clone()
    out, _, defense = run(name, gradient, labels, seed=7)
    assert out.shape == gradient.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert torch.equal(gradient, before), "the input was modified in place"
    again, _, _ = run(name, gradient, labels, seed=7)
    assert torch.equal(out, again), "same generator seed, different output"
    assert isinstance(defense.summary(), dict)
    if name in RANDOMISED:
        other, _, _ = run(name, gradient, labels, seed=8)
        assert not torch.equal(out, other)


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize(
    "labels",
    [[], [1], [0], [0, 0, 0, 0], [1, 1, 1], [0, 1]],
    ids=["empty", "one-pos", "one-neg", "all-neg", "all-pos", "pair"],
)
def test_edge_batches(name: str, labels: list[int]) -> None:
    label_tensor = torch.tensor(labels, dtype=torch.int64)
    gradient = torch.randn(len(labels), 2, 3, generator=torch.Generator().manual_seed(1))
    out, _, _ = run(name, gradient, label_tensor)
    assert out.shape == gradient.shape and out.dtype == gradient.dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(PARAMS))
@HYPOTHESIS
@given(data=st.data())
def test_conformance_property(name: str, data: st.DataObject) -> None:
    batch = data.draw(st.integers(0, 9), label="batch")
    dim = data.draw(st.integers(1, 6), label="dim")
    values = data.draw(
        st.lists(
            st.one_of(st.just(0.0), st.floats(-1e3, 1e3, allow_subnormal=False)),
            min_size=batch * dim,
            max_size=batch * dim,
        ),
        label="values",
    )
    labels = data.draw(st.lists(st.integers(0, 1), min_size=batch, max_size=batch), label="y")
    gradient = torch.tensor(values, dtype=torch.float64).reshape(batch, dim)
    label_tensor = torch.tensor(labels, dtype=torch.int64)
    before = gradient.clone()
    out, _, _ = run(name, gradient, label_tensor, seed=3)
    assert out.shape == gradient.shape and out.dtype == gradient.dtype
    assert torch.isfinite(out).all()
    assert torch.equal(gradient, before)
    again, _, _ = run(name, gradient, label_tensor, seed=3)
    assert torch.equal(out, again)


def test_bad_params_are_refused() -> None:
    with pytest.raises(UnknownPluginError, match="allowed: .*marvell"):
        build_defense("marvel", {"s": 1.0})
    for name, params in [
        ("iso", {"t": -1.0}),
        ("laplace", {"b": 0.0}),
        ("sparsify", {"kept_fraction": 0.0}),
        ("sparsify", {"kept_fraction": 1.5}),
        ("discrete_sgd", {"bins": 1}),
        ("perp", {"lower": 3.0, "upper": 2.0}),
        ("marvell", {"s": 0.0}),
        ("marvell", {"s": 1.0, "uv_choice": "both"}),
        ("dp_gaussian", {"noise_multiplier": 1.0}),
        ("dp_gaussian", {"clip": 1.0, "adaptive": True, "noise_multiplier": 1.0}),
        ("ppdl", {"theta_u": 0.5, "unknown": 1}),
        ("grad_perturb", {"epsilon": 0.0}),
        ("grad_perturb", {}),
        # scales whose noise overflows float32 or is inf/NaN (they failed deep in the step)
        ("iso", {"t": 1e300}),
        ("marvell", {"s": 1e300}),
        ("laplace", {"b": 1e300}),
        ("perp", {"upper": 1e300}),
        ("grad_perturb", {"epsilon": 1e-300}),
        ("dp_gaussian", {"clip": 1e30, "noise_multiplier": 1e30}),
        ("ppdl", {"theta_u": 0.5, "epsilon": 1e-300}),
        # perp only adds noise orthogonal to a row: it cannot bring a row below ‖g_max‖
        ("perp", {"lower": 0.0, "upper": 0.5}),
    ]:
        with pytest.raises(ValidationError):
            build_defense(name, params)


# --------------------------------------------------------------------------- noise statistics


def tiled(copies: int):
    """A small two-class batch repeated `copies` times: batch statistics stay the same."""
    gradient, labels = two_class_batch(8, (5,), seed=2)
    gradient[3] = 0.0  # a zero row
    return gradient, labels, gradient.repeat(copies, 1), labels.repeat(copies)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("max_norm", {}),
        ("iso", {"t": 2.0}),
        ("perp", {}),
        ("marvell", {"s": 4.0}),
        ("marvell", {"s": 0.5, "uv_choice": "same"}),
        ("dp_gaussian", {"clip": 100.0, "noise_multiplier": 0.01}),
        ("laplace", {"b": 0.3}),
        ("grad_perturb", {"epsilon": 2.0}),
    ],
)
def test_noise_is_zero_mean(name: str, params: dict) -> None:
    # Mean perturbation of each (row, coordinate) over 4000 copies within 5 standard errors.
    copies = 4000
    gradient, _, batch, labels = tiled(copies)
    out, _, _ = run(name, batch.double(), labels, seed=11, **params)
    noise = (out - batch.double()).reshape(copies, *gradient.shape)
    mean = noise.mean(0)
    standard_error = noise.std(0) / math.sqrt(copies)
    assert (mean.abs() <= 5.0 * standard_error + 1e-12).all()
    assert noise.abs().max() > 0


def test_max_norm_equalises_expected_squared_norms() -> None:
    copies = 4000
    gradient, _, batch, labels = tiled(copies)
    out, _, _ = run("max_norm", batch.double(), labels, seed=5)
    squared = out.reshape(copies, *gradient.shape).square().sum(-1).mean(0)
    largest = gradient.double().square().sum(-1).max()
    nonzero = gradient.square().sum(-1) > 0
    assert torch.allclose(squared[nonzero], largest.expand(int(nonzero.sum())), rtol=0.1)
    assert (squared[~nonzero] == 0).all()  # a zero row has no direction to scale


def test_laplace_has_the_right_scale() -> None:
    b = 0.25
    out, _, _ = run("laplace", torch.zeros(400, 250, dtype=torch.float64), torch.zeros(400), b=b)
    assert out.mean().abs() < 5 * math.sqrt(2) * b / math.sqrt(out.numel())
    assert out.var().item() == pytest.approx(2 * b * b, rel=0.02)
    assert out.abs().mean().item() == pytest.approx(b, rel=0.02)


def test_iso_and_perp_noise_sizes() -> None:
    gradient, labels = two_class_batch(2000, (10,), seed=4)
    largest = gradient.double().square().sum(1).max()
    out, _, _ = run("iso", gradient.double(), labels, seed=1, t=3.0)
    assert (out - gradient).var().item() == pytest.approx(3.0 * largest.item() / 10, rel=0.03)
    out, _, _ = run("perp", gradient.double(), labels, seed=1, lower=1.0, upper=2.0)
    noise = out - gradient
    assert (noise * gradient).sum(1).abs().max() < 1e-9  # orthogonal to each row
    norms = out.norm(dim=1) / largest.sqrt()
    assert norms.min() >= 1.0 - 1e-9 and norms.max() <= 2.0 + 1e-9
    assert norms.mean().item() == pytest.approx(1.5, abs=0.03)


# --------------------------------------------------------------------------- sparsify, discrete_sgd


@HYPOTHESIS
@given(
    batch=st.integers(1, 6),
    dim=st.integers(1, 40),
    kept=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_sparsify_keeps_the_stated_count(batch: int, dim: int, kept: float, seed: int) -> None:
    gradient = torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed))
    out, _, _ = run("sparsify", gradient, torch.zeros(batch), kept_fraction=kept)
    count = kept_count(kept, dim)
    assert count == max(1, min(dim, math.floor(kept * dim + 0.5)))
    assert ((out != 0).sum(1) == count).all()
    assert torch.equal(out[out != 0], gradient[out != 0])
    smallest_kept = torch.where(out != 0, gradient.abs(), math.inf).min(1).values
    largest_dropped = torch.where(out == 0, gradient.abs(), -math.inf).max(1).values
    assert (smallest_kept >= largest_dropped).all()


def test_sparsify_batch_scope_is_fu_et_als_tensor_pruner() -> None:
    # Fu et al.: t = the int(kept·B·d)-th largest |g| over the whole block, keep |g| > t only.
    gradient = torch.tensor([[4.0, -3.0, 0.5, 2.0],
                             [0.01, -0.02, 0.03, 0.0],  # a small-gradient row
                             [-5.0, 1.0, 3.0, -0.5]])
    out, _, defense = run("sparsify", gradient, torch.zeros(3), kept_fraction=0.5, scope="batch")
    # int(0.5·12) = 6: |g| ranked 5, 4, 3, 3, 2, 1 → t = 1, and 1.0 itself is not above it.
    expected = torch.tensor([[4.0, -3.0, 0.0, 2.0],
                             [0.0, 0.0, 0.0, 0.0],
                             [-5.0, 0.0, 3.0, 0.0]])
    assert torch.equal(out, expected)
    assert defense.state_dict() == {}
    rows, _, _ = run("sparsify", gradient, torch.zeros(3), kept_fraction=0.5)  # default: "row"
    assert ((rows != 0).sum(1) == 2).all()  # every row keeps its own two, the small row too
    for kept in (0.75, 0.25, 0.1):  # against the formula on a random block
        block = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))
        out, _, _ = run("sparsify", block, torch.zeros(16), kept_fraction=kept, scope="batch")
        threshold = block.abs().reshape(1, -1).topk(int(block.numel() * kept))[0][0][-1]
        assert torch.equal(out, torch.where(block.abs() > threshold, block, 0.0))
    with pytest.raises(ValidationError, match="'row' or 'batch'"):
        build_defense("sparsify", {"kept_fraction": 0.5, "scope": "tensor"})


def test_discrete_sgd_interval_from_the_first_epoch() -> None:
    defense = build_defense("discrete_sgd", {"bins": 4})
    gen = torch.Generator().manual_seed(0)
    seen = []
    for step in range(3):
        gradient = torch.randn(16, 6, generator=gen) * (step + 1)
        seen.append(gradient)
        ctx = context(torch.zeros(16), epoch=0, step=step)
        out = defense(gradient, ctx)
        values = torch.cat(seen).double()
        mean, std = values.mean().item(), values.std(unbiased=False).item()
        low, high = ctx.diagnostics["discrete_sgd.low"], ctx.diagnostics["discrete_sgd.high"]
        assert low == pytest.approx(mean - 2 * std) and high == pytest.approx(mean + 2 * std)
        levels = torch.linspace(low, high, 5, dtype=torch.float64)
        distance = (out.double().unsqueeze(-1) - levels).abs().min(-1).values
        assert distance.max() < 1e-5  # every value is one of the N + 1 edges
        clamped = gradient.double().clamp(low, high).unsqueeze(-1)
        nearest = levels[(clamped - levels).abs().argmin(-1)]
        assert torch.allclose(out.double(), nearest, atol=1e-5)
    frozen = (low, high)
    for step in range(3, 5):
        ctx = context(torch.zeros(4), epoch=1, step=step)
        defense(torch.randn(4, 6, generator=gen) * 50, ctx)
        assert (ctx.diagnostics["discrete_sgd.low"], ctx.diagnostics["discrete_sgd.high"]) == frozen
    assert defense.summary()["interval_frozen"] is True


def test_ppdl_shares_a_random_bounded_fraction() -> None:
    gradient = torch.randn(50, 40, generator=torch.Generator().manual_seed(0)) * 1e-3
    out, _, _ = run("ppdl", gradient, torch.zeros(50), theta_u=0.25, tau=0.0)
    assert ((out != 0).sum(1) == 10).all()
    assert out.abs().max() <= 0.001 + 1e-9
    out, _, _ = run("ppdl", gradient, torch.zeros(50), theta_u=0.25, tau=5e-4)
    assert ((out != 0).sum(1) <= 10).all()
    assert (out[out != 0].abs() >= 5e-4).all()


# --------------------------------------------------------------------------- dp_gaussian


def test_dp_gaussian_clips_rows() -> None:
    gradient, labels = two_class_batch(64, (6,))
    out, ctx, _ = run("dp_gaussian", gradient, labels, clip=0.5, noise_multiplier=0.0)
    assert out.norm(dim=1).max() <= 0.5 + 1e-6
    out, ctx, _ = run("dp_gaussian", gradient, labels, clip=None, adaptive=True)
    assert ctx.diagnostics["dp_gaussian.clip"] == pytest.approx(0.5 * gradient.norm(dim=1).median())


def test_dp_gaussian_adaptive_quantile() -> None:
    gradient, labels = two_class_batch(64, (6,))
    norms = gradient.double().norm(dim=1)
    for q in (0.5, 0.9):
        out, ctx, defense = run("dp_gaussian", gradient, labels, clip=None, adaptive=True,
                                adaptive_quantile=q, noise_multiplier=0.0)
        clip = float(np.quantile(norms.numpy(), q))
        assert ctx.diagnostics["dp_gaussian.clip"] == pytest.approx(clip)
        assert out.norm(dim=1).max() <= clip + 1e-5
        assert float((norms > clip).double().mean()) == pytest.approx(1 - q, abs=1 / 64)
        assert defense.summary()["clip"] == f"adaptive (quantile {q:g})"
        assert defense.state_dict() == {"epochs": [0], "steps": 1}
    with pytest.raises(ValidationError, match="adaptive_quantile needs adaptive = true"):
        build_defense("dp_gaussian", {"clip": 1.0, "adaptive_quantile": 0.5, "noise_multiplier": 1.0})
    with pytest.raises(ValidationError, match="adaptive_quantile"):
        build_defense("dp_gaussian", {"adaptive": True, "adaptive_quantile": 1.5,
                                      "noise_multiplier": 1.0})


def test_dp_gaussian_epsilon_is_finite_and_falls_with_sigma() -> None:
    gradient, labels = two_class_batch(16, (4,))
    epsilons = []
    for sigma in [0.5, 1.0, 2.0, 4.0]:
        defense = build_defense(
            "dp_gaussian", {"clip": 1.0, "noise_multiplier": sigma, "sampling_rate": 0.01}
        )
        for epoch, step in [(0, 0), (0, 1), (1, 2)]:
            defense(gradient, context(labels, epoch=epoch, step=step))
        report = defense.summary()
        assert report["epochs_seen"] == 2 and report["steps_seen"] == 3
        assert report["epsilon_covers"] == EPSILON_COVERS
        assert report["epsilon_if_poisson_sampled"] < report["epsilon"]
        epsilons.append(report["epsilon"])
    assert all(math.isfinite(e) and e > 0 for e in epsilons)
    assert epsilons == sorted(epsilons, reverse=True) and len(set(epsilons)) == 4
    silent = build_defense("dp_gaussian", {"clip": 1.0, "noise_multiplier": 0.0})
    silent(gradient, context(labels))
    assert silent.summary()["epsilon"] == math.inf


def test_dp_gaussian_composes_epsilon_over_every_partys_rows() -> None:
    """Each party has its own instance, and one example's label shapes the row every party
    receives: ε for one party alone composes over its epochs, ε for all of them over every
    party's releases (2 parties x 3 epochs = 6 Gaussian releases, as dp_accounting gives)."""
    import dp_accounting

    gradient, labels = two_class_batch(32, (8,))
    chains = {k: DefenseChain([("dp_gaussian", {"clip": 1.0, "noise_multiplier": 2.0})], seed=0)
              for k in (1, 2)}
    for epoch in range(3):
        for party, chain in chains.items():
            chain.apply(gradient, labels, party_id=party, epoch=epoch, step=epoch, num_classes=2)

    def epsilon(releases: int) -> float:
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), releases))
        return accountant.get_epsilon(1e-5)

    summaries = chain_summaries(chains)
    for party in (1, 2):
        (entry,) = summaries[party]["parties"][str(party)]
        assert entry["epsilon"] == pytest.approx(epsilon(3))
        assert entry["epsilon_all_parties"] == pytest.approx(epsilon(6))
        assert entry["parties_composed"] == 2
    alone = chain_summaries({1: chains[1]})[1]["parties"]["1"][0]
    assert "epsilon_all_parties" not in alone  # one passive party: nothing to compose


def test_defense_figures_keep_their_significant_digits_in_the_report() -> None:
    gradient, labels = two_class_batch(32, (8,))
    chains = {1: DefenseChain([("dp_gaussian", {"clip": 1.0, "noise_multiplier": 0.0})], seed=0)}
    chains[1].apply(gradient, labels, party_id=1, epoch=0, step=0, num_classes=2)
    outcome = json.loads(json.dumps(finite_or_null({"defenses": chain_summaries(chains)})))
    (row,) = [line for line in _defense_md({"defense": [{"name": "dp_gaussian"}]}, outcome)
              if "| dp_gaussian |" in line]
    assert "delta=1e-05" in row and "epsilon=n/a" in row  # not delta=0.0000
    assert "epsilon_note=infinite: noise_multiplier = 0 adds no noise" in row


# --------------------------------------------------------------------------- Marvell solver


def power(sol, p: float, d: int) -> float:
    positive = sol.lam11 + (d - 1) * sol.lam21
    negative = sol.lam10 + (d - 1) * sol.lam20
    return p * positive + (1 - p) * negative


def sumkl_at(lam, u, v, d, g) -> float:
    return objective(*lam, u, v, d, g) / 2 - d


instances = st.builds(
    lambda d, g, log_u, log_v, zero, p, s: (
        0.0 if zero == "u" else g * 10**log_u,
        0.0 if zero == "v" else g * 10**log_v,
        g,
        p,
        d,
        s * g,
    ),
    d=st.sampled_from([1, 2, 5, 128, 1600]),
    g=st.floats(1e-6, 1e3),
    log_u=st.floats(-4, 1),
    log_v=st.floats(-4, 1),
    zero=st.sampled_from(["", "", "", "u", "v"]),
    p=st.floats(0.01, 0.99),
    s=st.floats(0.01, 10),
)


@settings(deadline=None, max_examples=150, derandomize=True)
@given(instance=instances, seed=st.integers(0, 2**16))
def test_marvell_solution_is_feasible_tight_and_beats_other_points(instance, seed) -> None:
    u, v, g, p, d, budget = instance
    sol = solve(u, v, g, p, d, budget)
    lam = (sol.lam10, sol.lam20, sol.lam11, sol.lam21)
    assert min(lam) >= 0 and sol.lam20 <= sol.lam10 and sol.lam21 <= sol.lam11
    assert power(sol, p, d) == pytest.approx(budget, rel=1e-6)
    assert (sol.lam21 if u < v else sol.lam20) == 0.0
    assert sol.sumkl == pytest.approx(sol.objective / 2 - d, rel=1e-9, abs=1e-9 * d)
    assert sol.sumkl == pytest.approx(sumkl_at(lam, u, v, d, g), rel=1e-6, abs=1e-9 * d)
    # iso at the same power: λ₁ = λ₂ = P/d for both classes.
    iso = budget / d
    assert sol.sumkl <= sumkl_at((iso, iso, iso, iso), u, v, d, g) * (1 + 1e-9)
    # Random feasible points: a Dirichlet split of the budget, then λ₂ ≤ λ₁ enforced.
    rng = np.random.default_rng(seed)
    weights = np.array([1 - p, (1 - p) * (d - 1), p, p * (d - 1)])
    for share in rng.dirichlet(np.ones(4), size=20):
        point = np.divide(share * budget, weights, out=np.zeros(4), where=weights > 0)
        point[1], point[3] = min(point[1], point[0]), min(point[3], point[2])
        assert sol.sumkl <= sumkl_at(tuple(point), u, v, d, g) * (1 + 1e-9)


def slsqp_sumkl(u, v, g, p, d, budget, starts: int = 6) -> float:
    """Independent check: SLSQP on all four λ (as fractions of the budget), best of starts."""
    weights = np.array([1 - p, (1 - p) * (d - 1), p, p * (d - 1)])

    def lam_of(x):
        return x * budget / weights

    def f(x):
        return objective(*lam_of(x), u, v, d, g)

    constraints = [
        {"type": "ineq", "fun": lambda x: 1.0 - x.sum()},
        {"type": "ineq", "fun": lambda x: lam_of(x)[0] - lam_of(x)[1]},
        {"type": "ineq", "fun": lambda x: lam_of(x)[2] - lam_of(x)[3]},
    ]
    rng = np.random.default_rng(0)
    best = math.inf
    for k in range(starts):
        start = weights / weights.sum() if k == 0 else rng.dirichlet(np.ones(4))
        lam = lam_of(start)
        lam[1], lam[3] = min(lam[1], lam[0]), min(lam[3], lam[2])
        result = minimize(
            f,
            lam * weights / budget,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * 4,
            constraints=constraints,
            options={"ftol": 1e-15, "maxiter": 2000},
        )
        x = result.x
        lam = lam_of(x)
        feasible = x.sum() <= 1 + 1e-9 and lam[1] <= lam[0] * (1 + 1e-9) + 1e-15
        feasible = feasible and lam[3] <= lam[2] * (1 + 1e-9) + 1e-15 and x.min() >= -1e-12
        if feasible and np.isfinite(result.fun):
            best = min(best, result.fun / 2 - d)
    return best


@pytest.mark.parametrize(
    ("u", "v", "g", "p", "d", "s"),
    [
        (1.0, 2.0, 0.5, 0.1, 128, 4.0),
        (2.0, 1.0, 0.5, 0.1, 128, 4.0),
        (0.01, 0.02, 3.0, 0.3, 128, 1.0),
        (0.3, 0.1, 2.0, 0.5, 16, 0.25),
        (0.05, 0.05, 1.0, 0.2, 32, 0.1),
        (0.0, 0.4, 1.5, 0.35, 8, 2.0),
        (3e-4, 1e-4, 2e-3, 0.05, 64, 4.0),
        (0.2, 0.9, 0.1, 0.7, 2, 1.0),
    ],
)
def test_marvell_solver_matches_slsqp(u, v, g, p, d, s) -> None:
    sol = solve(u, v, g, p, d, s * g)
    reference = slsqp_sumkl(u, v, g, p, d, s * g)
    assert sol.sumkl <= reference * (1 + 1e-6)
    assert sol.sumkl == pytest.approx(reference, rel=1e-4)


@pytest.mark.parametrize(("p", "s"), [(0.1, 4.0), (0.5, 0.25), (0.9, 1.0)])
def test_marvell_closed_form_for_zero_variances(p: float, s: float) -> None:
    g = 2.0
    sol = solve(0.0, 0.0, g, p, 128, s * g)
    assert sol.lam20 == 0.0 and sol.lam21 == 0.0 and sol.iterations == 0
    assert p * sol.lam11 + (1 - p) * sol.lam10 == pytest.approx(s * g, rel=1e-12)

    def along(a):  # 1-D model: sumKL = ((a + g)/c + (c + g)/a)/2 − 1 on the power line
        c = (s * g - (1 - p) * a) / p
        return ((a + g) / c + (c + g) / a) / 2 - 1

    best = minimize_scalar(along, bounds=(1e-12, s * g / (1 - p) - 1e-12), method="bounded",
                           options={"xatol": 1e-12})
    assert sol.sumkl == pytest.approx(best.fun, rel=1e-6)
    assert sol.sumkl == pytest.approx(along(sol.lam10), rel=1e-12)


def test_marvell_solver_refuses_bad_instances() -> None:
    bad = {"g": (1, 1, 0, 0.5, 4, 1), "p=0": (1, 1, 1, 0, 4, 1), "p=1": (1, 1, 1, 1, 4, 1)}
    for args in [*bad.values(), (-1, 1, 1, 0.5, 4, 1)]:
        with pytest.raises(ValueError):
            solve(*args)


# --------------------------------------------------------------------------- Marvell defense


def test_marvell_noise_has_the_solved_covariance() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, dim = 40000, 6
    labels = (torch.rand(batch, generator=gen) < 0.3).long()
    spread = torch.where(labels == 1, 1.0, 0.3).unsqueeze(1)  # u < v: negatives get iso noise
    gradient = torch.randn(batch, dim, generator=gen, dtype=torch.float64) * spread
    gradient[:, 0] += labels.double()
    out, ctx, _ = run("marvell", gradient, labels, seed=3, s=2.0)
    diag = ctx.diagnostics
    assert diag["marvell.lam21"] == 0.0 and diag["marvell.lam20"] > 0.01
    positive = labels == 1
    for cls, key in [(1, "marvell.v"), (0, "marvell.u")]:
        rows = gradient[labels == cls]
        exact = (rows - rows.mean(0)).square().sum().item() / (dim * len(rows))
        assert diag[key] == pytest.approx(exact, rel=1e-10)
    delta = gradient[positive].mean(0) - gradient[~positive].mean(0)
    unit = delta / delta.norm()
    noise = out - gradient
    expected = [(1, diag["marvell.lam11"], 0.0), (0, diag["marvell.lam10"], diag["marvell.lam20"])]
    for cls, lam1, lam2 in expected:
        rows = noise[labels == cls]
        along = rows @ unit
        orthogonal = rows - along.unsqueeze(1) * unit
        assert along.var().item() == pytest.approx(lam1, rel=0.05)
        per_coordinate = orthogonal.square().sum(1).mean().item() / (dim - 1)
        assert per_coordinate == pytest.approx(lam2, rel=0.05, abs=1e-12)
    assert diag["marvell.P"] == pytest.approx(2.0 * diag["marvell.g"])
    assert diag["marvell.sumkl_after"] < diag["marvell.sumkl_before"]
    assert diag["marvell.auc_bound"] == pytest.approx(auc_bound(diag["marvell.sumkl_after"]))


@pytest.mark.parametrize("uv_choice", ["uv", "same", "zero"])
def test_marvells_logged_bound_is_under_the_batchs_fitted_model(uv_choice: str) -> None:
    """With uv_choice same / zero the solver optimises another model (u = v); the bound logged
    is that of the sumKL the noise reaches under the batch's own u, v, and the norm attack's
    AUC on the defended batch stays below it."""
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(512, generator=gen) < 0.5).long()
    spread = torch.where(labels == 1, 0.2, 1.0).unsqueeze(1)  # the classes differ in spread
    gradient = torch.randn(512, 16, generator=gen) * spread + 0.05 * labels.unsqueeze(1)
    out, ctx, defense = run("marvell", gradient, labels, s=4.0, uv_choice=uv_choice)
    diag = ctx.diagnostics
    assert diag["marvell.auc_bound"] == pytest.approx(auc_bound(diag["marvell.sumkl_after_empirical"]))
    if uv_choice == "uv":
        assert diag["marvell.sumkl_after"] == pytest.approx(diag["marvell.sumkl_after_empirical"])
    norms = out.double().norm(dim=1).numpy()
    auc = roc_auc_score(labels.numpy(), norms)
    assert max(auc, 1 - auc) <= diag["marvell.auc_bound"] + 1e-9
    assert defense.summary()["mean_sumkl_after"] == pytest.approx(diag["marvell.sumkl_after_empirical"])


@pytest.mark.parametrize("labels", [[0] * 6, [1] * 6, []])
def test_marvell_passes_one_class_batches_through(labels: list[int]) -> None:
    gradient = torch.randn(len(labels), 4)
    defense = build_defense("marvell", {"s": 1.0})
    ctx = context(torch.tensor(labels, dtype=torch.int64))
    assert torch.equal(defense(gradient, ctx), gradient)
    assert ctx.diagnostics["marvell.passthrough"] == 1.0
    assert defense.summary()["passthrough"] == 1


def test_marvell_passes_equal_class_means_through() -> None:
    gradient = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [3.0, 4.0]])
    labels = torch.tensor([0, 0, 1, 1])
    out, ctx, defense = run("marvell", gradient, labels)
    assert torch.equal(out, gradient) and ctx.diagnostics["marvell.passthrough"] == 1.0
    gradient2, labels2 = two_class_batch(16, (4,))
    defense(gradient2, context(labels2))
    summary = defense.summary()
    assert summary["batches"] == 2 and summary["passthrough"] == 1
    assert summary["mean_sumkl_after"] > 0 and 0.5 < summary["max_auc_bound"] <= 1.0


def test_marvell_needs_binary_labels() -> None:
    gradient, labels = two_class_batch(8, (3,))
    defense = build_defense("marvell", {"s": 1.0})
    ctx = context(labels)
    ctx.num_classes = 3
    with pytest.raises(ValueError, match="binary"):
        defense(gradient, ctx)
    with pytest.raises(ValueError, match="0/1"):
        defense(gradient, context(labels * 2))


def test_marvell_dynamic_stops_at_the_round_cap() -> None:
    gradient, labels = two_class_batch(64, (16,))
    params = {"s": 1e-6, "dynamic": True, "target_error": 0.45, "dynamic_max_rounds": 3}
    _, ctx, _ = run("marvell", gradient, labels, **params)
    diag = ctx.diagnostics
    assert diag["marvell.P"] == pytest.approx(1e-6 * 1.5**2 * diag["marvell.g"])  # 3 solves
    assert diag["marvell.sumkl_after"] > (2 - 4 * 0.45) ** 2


def test_marvell_dynamic_raises_power_until_the_target() -> None:
    gradient, labels = two_class_batch(64, (16,))
    gradient *= 3.0
    target = 0.3
    out, ctx, _ = run("marvell", gradient, labels, s=0.01, dynamic=True, target_error=target)
    diag = ctx.diagnostics
    assert diag["marvell.sumkl_after"] <= (2 - 4 * target) ** 2
    rounds = math.log(diag["marvell.P"] / (0.01 * diag["marvell.g"])) / math.log(1.5)
    assert rounds == pytest.approx(round(rounds)) and round(rounds) >= 1
    _, fixed, _ = run("marvell", gradient, labels, s=0.01)
    assert fixed.diagnostics["marvell.sumkl_after"] > (2 - 4 * target) ** 2


@pytest.mark.parametrize("uv_choice", ["same", "zero"])
def test_marvell_uv_choices(uv_choice: str) -> None:
    gradient, labels = two_class_batch(64, (8,))
    out, ctx, _ = run("marvell", gradient, labels, uv_choice=uv_choice)
    diag = ctx.diagnostics
    if uv_choice == "zero":
        assert diag["marvell.lam20"] == 0.0 and diag["marvell.lam21"] == 0.0
    assert math.isfinite(diag["marvell.sumkl_after_empirical"])
    assert torch.isfinite(out).all()


def test_auc_bound() -> None:
    assert auc_bound(0.0) == 0.5
    assert auc_bound(1.0) == pytest.approx(0.5 + 0.5 - 1 / 8)
    assert auc_bound(4.0) == 1.0 and auc_bound(math.inf) == 1.0


def test_bench_marvell_runs() -> None:
    median, fastest = time_marvell(64, 8, repeats=2)
    assert median >= fastest > 0


# --------------------------------------------------------------------------- chain


def test_empty_chain_is_identity() -> None:
    gradient, labels = two_class_batch(8, (3,))
    chain = DefenseChain([], seed=1)
    out, diagnostics = chain.apply(gradient, labels, 1, 0, 0, 2)
    assert torch.equal(out, gradient) and diagnostics == {}
    assert chain.summary()["chain"] == []


def test_chain_applies_in_order_with_derived_generators() -> None:
    gradient, labels = two_class_batch(16, (2, 3))
    specs = [("sparsify", {"kept_fraction": 0.5}), {"name": "marvell", "params": {"s": 1.0}},
             ("laplace", {"b": 0.01})]
    chain = DefenseChain(specs, seed=5)
    out, diagnostics = chain.apply(gradient, labels, party_id=2, epoch=0, step=9, num_classes=2)
    expected = gradient
    for position, (name, params) in enumerate([("sparsify", specs[0][1]), ("marvell", {"s": 1.0}),
                                               ("laplace", specs[2][1])]):
        ctx = DefenseContext(labels, 2, 0, 9, 2, defense_generator(5, position, 2, 9))
        expected = build_defense(name, params)(expected, ctx)
    assert torch.equal(out, expected)
    assert "marvell.sumkl_after" in diagnostics
    again, _ = DefenseChain(specs, seed=5).apply(gradient, labels, 2, 0, 9, 2)
    assert torch.equal(out, again)
    for other in [DefenseChain(specs, seed=6).apply(gradient, labels, 2, 0, 9, 2),
                  chain.apply(gradient, labels, 2, 0, 10, 2),
                  chain.apply(gradient, labels, 3, 0, 9, 2)]:
        assert not torch.equal(out, other[0])


def test_chain_keeps_state_per_party_and_prefixes_repeated_names() -> None:
    chain = DefenseChain([("discrete_sgd", {"bins": 4}), ("discrete_sgd", {"bins": 8})], seed=0)
    gradient, labels = two_class_batch(8, (3,))
    _, diagnostics = chain.apply(gradient, labels, 1, 0, 0, 2)
    assert set(diagnostics) == {"0:discrete_sgd.low", "0:discrete_sgd.high",
                                "1:discrete_sgd.low", "1:discrete_sgd.high"}
    chain.apply(gradient * 10, labels, 2, 0, 0, 2)
    summary = chain.summary()
    assert summary["chain"] == ["discrete_sgd", "discrete_sgd"] and summary["seed"] == 0
    assert set(summary["parties"]) == {"1", "2"}
    assert summary["parties"]["1"][0]["values_seen"] == gradient.numel()
    assert chain.defenses(1)[0] is not chain.defenses(2)[0]


def test_chain_refuses_bad_specs_when_built() -> None:
    with pytest.raises(UnknownPluginError):
        DefenseChain([("nope", {})], seed=0)
    with pytest.raises(ValidationError):
        DefenseChain([("iso", {"t": -1})], seed=0)
    with pytest.raises(ValueError, match="name"):
        DefenseChain([{"params": {}}], seed=0)


# --------------------------------------------------------------------------- grad_perturb


def test_grad_perturb_mixes_each_rows_class_gradients_with_laplace_weights() -> None:
    # With g^(c) = the unit vector e_c, row j's noise is exactly its K weights u_j.
    batch, classes, epsilon = 20000, 3, 4.0
    gradient = torch.zeros(batch, classes, dtype=torch.float64)
    per_class = torch.eye(classes, dtype=torch.float64)[:, None, :].expand(classes, batch, classes)
    ctx = context(torch.zeros(batch, dtype=torch.int64), seed=3, class_gradients=per_class)
    weights = build_defense("grad_perturb", {"epsilon": epsilon})(gradient, ctx)
    scale = 2.0 / epsilon
    assert weights.abs().mean().item() == pytest.approx(scale, rel=0.02)  # E|Laplace(b)| = b
    assert weights.var(0).mean().item() == pytest.approx(2 * scale**2, rel=0.04)
    correlation = torch.corrcoef(weights.T)
    assert (correlation - torch.eye(classes, dtype=torch.float64)).abs().max() < 0.03
    assert ctx.diagnostics["grad_perturb.gradient_norm_mean"] == 0.0


def test_grad_perturb_adds_the_weighted_sum_to_the_gradient() -> None:
    gradient, labels = two_class_batch(6, (2, 3), seed=1)
    per_class = binary_class_gradients(gradient)
    ctx = context(labels, seed=4, class_gradients=per_class)
    out = build_defense("grad_perturb", {"epsilon": 0.5})(gradient, ctx)
    noise = (out - gradient).reshape(6, -1)
    # Each row's noise lies in the span of its own two class gradients.
    basis = per_class.reshape(2, 6, -1).permute(1, 2, 0)  # [B, d, K]
    weights = torch.linalg.lstsq(basis, noise[..., None]).solution
    assert torch.allclose(basis @ weights, noise[..., None], atol=1e-5)
    assert not torch.equal(out, gradient)


def test_grad_perturb_without_class_gradients_is_refused() -> None:
    gradient, labels = two_class_batch(4, (3,))
    defense = build_defense("grad_perturb", {"epsilon": 1.0})
    with pytest.raises(ValueError, match=r"grad_perturb needs ctx.class_gradients of shape \[K, 4, 3\]"):
        defense(gradient, context(labels))
    with pytest.raises(ValueError, match="got \\(2, 3, 3\\)"):
        defense(gradient, context(labels, class_gradients=torch.zeros(2, 3, 3)))
    assert defense.summary()["laplace_scale"] == 2.0


def test_chain_asks_for_class_gradients_only_when_a_defense_reads_them() -> None:
    assert not DefenseChain([("laplace", {"b": 0.1}), ("marvell", {"s": 1.0})], 0).needs_class_gradients
    chain = DefenseChain([("laplace", {"b": 0.1}), ("grad_perturb", {"epsilon": 1.0})], seed=2)
    assert chain.needs_class_gradients
    gradient, labels = two_class_batch(8, (3,))
    per_class = binary_class_gradients(gradient)
    out, diagnostics = chain.apply(gradient, labels, 1, 0, 5, 2, class_gradients=per_class)
    expected = build_defense("laplace", {"b": 0.1})(
        gradient, DefenseContext(labels, 1, 0, 5, 2, defense_generator(2, 0, 1, 5)))
    # The clean per-class gradients reach grad_perturb after laplace has run.
    expected = build_defense("grad_perturb", {"epsilon": 1.0})(
        expected, DefenseContext(labels, 1, 0, 5, 2, defense_generator(2, 1, 1, 5),
                                 class_gradients=per_class))
    assert torch.equal(out, expected) and "grad_perturb.noise_norm_mean" in diagnostics
