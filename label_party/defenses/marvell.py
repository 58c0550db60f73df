"""Marvell (Li et al., Algorithm 1): class-dependent Gaussian noise minimising the sumKL bound."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.marvell_solver import MarvellSolution, solve, sumkl_excess
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore
from splitleak.settings import MAX_ITERATIONS, MAX_RESTARTS, MAX_SCALE

_BLOCK_VALUES = 1 << 16  # float64 values per block (512 KiB: stays in cache)


class MarvellParams(DefenseParams):
    s: float = Field(gt=0.0, le=MAX_SCALE)  # power scale: P = s·‖Δg‖² (paper: 0.1, 0.25, 1, 4)
    uv_choice: Literal["uv", "same", "zero"] = "uv"  # per-class u, v | both (u+v)/2 | both 0
    dynamic: bool = False  # multiply P by 1.5 until sumKL ≤ (2 − 4·target_error)²
    target_error: float = Field(default=0.2, ge=0.0, lt=0.5)  # detection-error lower bound
    dynamic_max_rounds: int = Field(default=60, ge=1, le=MAX_RESTARTS)  # cap on the ×1.5 rounds
    tol: float = Field(default=1e-7, gt=0.0)  # solver: relative sumKL improvement per sweep
    max_iter: int = Field(default=200, ge=1, le=MAX_ITERATIONS)  # solver: SMO sweeps


def auc_bound(sumkl: float) -> float:
    """Li et al. Thm 1: every attack's leak AUC ≤ 1/2 + √ε/2 − ε/8 when sumKL ≤ ε < 4."""
    if not sumkl < 4.0:
        return 1.0
    return 0.5 + math.sqrt(sumkl) / 2.0 - sumkl / 8.0


def _class_statistics(
    rows: torch.Tensor, positive: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class (row 0 negative, 1 positive): Σ g_j [2, d] and Σ ‖g_j‖² [2], in float64.

    Converted to float64 a cache-sized block of rows at a time: one read of the batch.
    """
    membership = torch.stack((~positive, positive)).to(torch.float64)  # [2, B]
    sums = torch.zeros(2, rows.shape[1], dtype=torch.float64, device=rows.device)
    squares = torch.empty(rows.shape[0], dtype=torch.float64, device=rows.device)
    block = max(1, _BLOCK_VALUES // rows.shape[1])
    for start in range(0, rows.shape[0], block):
        exact = rows[start : start + block].to(torch.float64)
        sums.addmm_(membership[:, start : start + block], exact)
        torch.linalg.vector_norm(exact, dim=1, out=squares[start : start + block])
    return sums, membership @ squares.square_()


@DEFENSES.register("marvell")
class Marvell(Defense):
    """Per batch: fit the class-conditional Gaussian model, solve for the noise, add it.

    u, v: negative / positive per-coordinate variance Σ‖g_j − ḡ_c‖²/(d·n_c); Δg = ḡ₁ − ḡ₀.
    Positive rows get η = sqrt(λ₁¹ − λ₂¹)·z·Δg/‖Δg‖ + sqrt(λ₂¹)·ξ, negative rows the same with
    λ⁰; z ~ N(0, 1), ξ ~ N(0, I_d). A batch with one class only, or Δg = 0, passes unchanged
    and is counted. Labels must be 0/1 (1 = positive). Diagnostics (per batch, "marvell.*"):
    sumkl_before = sumKL of the unperturbed model (λ = 0, empirical u, v; inf if u or v is 0);
    sumkl_after = the solver's sumKL under the uv_choice model; sumkl_after_empirical = the
    same noise evaluated with the empirical u, v; auc_bound from sumkl_after.
    """

    name = "marvell"
    binary_only = True
    Params = MarvellParams
    params: MarvellParams

    def __init__(self, params: MarvellParams) -> None:
        super().__init__(params)
        self._batches = 0
        self._passthrough = 0
        self._sumkl_after_total = 0.0
        self._worst_auc_bound = 0.5

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if ctx.num_classes != 2:
            raise ValueError(f"marvell needs binary labels; got num_classes={ctx.num_classes}")
        self._batches += 1
        labels = ctx.labels.reshape(-1)
        if is_empty(cut_gradient):
            return self._pass(cut_gradient, ctx)
        rows = as_rows(cut_gradient)
        batch, dim = rows.shape
        positive = labels == 1
        n1 = int(positive.sum())
        n0 = int((labels == 0).sum())
        if labels.numel() != batch or n0 + n1 != batch:
            raise ValueError("marvell: labels must be one 0/1 value per row")
        if n1 == 0 or n0 == 0:
            return self._pass(cut_gradient, ctx)

        class_sums, class_squares = _class_statistics(rows, positive)
        mean0, mean1 = class_sums[0] / n0, class_sums[1] / n1
        delta = mean1 - mean0
        g = float(delta @ delta)
        # Σ_c ‖g_j − ḡ_c‖² = Σ_c ‖g_j‖² − n_c·‖ḡ_c‖² (float64 throughout).
        u = max(float(class_squares[0]) - n0 * float(mean0 @ mean0), 0.0) / (dim * n0)
        v = max(float(class_squares[1]) - n1 * float(mean1 @ mean1), 0.0) / (dim * n1)
        if not (g > 0.0 and math.isfinite(u / g) and math.isfinite(v / g)):
            return self._pass(cut_gradient, ctx)  # Δg = 0 (or too small to divide by)

        p = n1 / batch
        solution, power = self._solve(u, v, g, p, dim)
        sumkl_after_empirical = 0.5 * sumkl_excess(
            (solution.lam10, solution.lam20, solution.lam11, solution.lam21), u, v, dim, g
        )
        # The bound holds for the Gaussian model fitted to the batch (its u, v): with
        # uv_choice "same"/"zero" the solver's own sumKL is of another model (u = v), so the
        # bound comes from the sumKL the same noise reaches under the fitted one.
        achieved = solution.sumkl if self.params.uv_choice == "uv" else sumkl_after_empirical
        self._sumkl_after_total += achieved
        bound = auc_bound(achieved)
        self._worst_auc_bound = max(self._worst_auc_bound, bound)
        ctx.diagnostics.update(
            {
                "marvell.passthrough": 0.0,
                "marvell.u": u,
                "marvell.v": v,
                "marvell.p": p,
                "marvell.g": g,
                "marvell.P": power,
                "marvell.lam10": solution.lam10,
                "marvell.lam20": solution.lam20,
                "marvell.lam11": solution.lam11,
                "marvell.lam21": solution.lam21,
                "marvell.sumkl_before": 0.5 * sumkl_excess((0.0, 0.0, 0.0, 0.0), u, v, dim, g),
                "marvell.sumkl_after": solution.sumkl,
                "marvell.sumkl_after_empirical": sumkl_after_empirical,
                "marvell.auc_bound": bound,
                "marvell.iterations": float(solution.iterations),
            }
        )
        noisy = self._perturb(rows, positive, delta / math.sqrt(g), solution, ctx)
        return restore(noisy, cut_gradient)

    def _solve(
        self, u: float, v: float, g: float, p: float, dim: int
    ) -> tuple[MarvellSolution, float]:
        if self.params.uv_choice == "same":
            u = v = 0.5 * (u + v)
        elif self.params.uv_choice == "zero":
            u = v = 0.0
        power = self.params.s * g
        threshold = (2.0 - 4.0 * self.params.target_error) ** 2
        rounds = self.params.dynamic_max_rounds if self.params.dynamic else 1
        for round_ in range(rounds):
            solution = solve(u, v, g, p, dim, power, self.params.tol, self.params.max_iter)
            if solution.sumkl <= threshold or round_ == rounds - 1:
                break
            power *= 1.5
        return solution, power

    @staticmethod
    def _perturb(
        rows: torch.Tensor,
        positive: torch.Tensor,
        direction: torch.Tensor,
        solution: MarvellSolution,
        ctx: DefenseContext,
    ) -> torch.Tensor:
        work = compute_dtype(rows.dtype)
        along = torch.where(
            positive,
            math.sqrt(max(solution.lam11 - solution.lam21, 0.0)),
            math.sqrt(max(solution.lam10 - solution.lam20, 0.0)),
        ).to(work)
        z = torch.randn(rows.shape[0], generator=ctx.generator, dtype=work).to(rows.device)
        out = torch.addr(rows.to(work), along * z, direction.to(work))
        # At most one class has isotropic noise (λ₂¹ = 0 or λ₂⁰ = 0): draw ξ for its rows only.
        for label, iso in ((1, solution.lam21), (0, solution.lam20)):
            if iso > 0.0:
                index = (positive == bool(label)).nonzero().squeeze(1)
                xi = torch.randn(index.numel(), rows.shape[1], generator=ctx.generator,
                                 dtype=work).to(rows.device)
                out.index_add_(0, index, xi, alpha=math.sqrt(iso))
        return out

    def _pass(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        self._passthrough += 1
        ctx.diagnostics["marvell.passthrough"] = 1.0
        return cut_gradient

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self._batches, "passthrough": self._passthrough,
                "sumkl_after_total": self._sumkl_after_total,
                "worst_auc_bound": self._worst_auc_bound}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches, self._passthrough = int(state["batches"]), int(state["passthrough"])
        self._sumkl_after_total = float(state["sumkl_after_total"])
        self._worst_auc_bound = float(state["worst_auc_bound"])

    def summary(self) -> dict[str, Any]:
        solved = self._batches - self._passthrough
        return {
            "batches": self._batches,
            "passthrough": self._passthrough,
            "mean_sumkl_after": self._sumkl_after_total / solved if solved else None,
            "max_auc_bound": self._worst_auc_bound if solved else None,
        }
