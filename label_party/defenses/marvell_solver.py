"""Marvell's 4-variable sumKL problem (Li et al., Thm 2), solved by SMO-like exact line search."""

from __future__ import annotations

import math
from dataclasses import dataclass

# λ = (λ₁⁰, λ₂⁰, λ₁¹, λ₂¹) = (a, b, c, e): ₁ along Δg, ₂ isotropic; ⁰ negative, ¹ positive class.
# Feasible set: every λ ≥ 0 and λ₂ᶜ ≤ λ₁ᶜ (the noise covariance must be positive semidefinite).
_NEWTON_MAX_STEPS = 60


@dataclass(frozen=True)
class MarvellSolution:
    """The optimal noise parameters, in the units of the inputs (squared gradient units)."""

    lam10: float  # negative class, variance along Δg/‖Δg‖ (total, isotropic part included)
    lam20: float  # negative class, isotropic variance per coordinate
    lam11: float  # positive class, along Δg
    lam21: float  # positive class, isotropic
    objective: float  # the objective of Thm 2 at the solution (= 2·sumkl + 2d)
    sumkl: float  # KL(P̃1‖P̃0) + KL(P̃0‖P̃1) of the Gaussian model at the solution
    iterations: int  # SMO sweeps (0 for a closed form)


def sumkl_excess(
    lam: tuple[float, float, float, float], u: float, v: float, d: int, g: float
) -> float:
    """2·sumKL = objective − 2d, summed from non-negative terms so small values stay accurate."""
    a, b, c, e = lam
    big_a, big_c = a + u, c + v  # variances along Δg, negative and positive class
    iso_0, iso_1 = b + u, e + v  # isotropic variances (the other d−1 directions)
    if big_a <= 0.0 or big_c <= 0.0:
        return math.inf
    total = (big_a - big_c) ** 2 / (big_a * big_c) + g * (1.0 / big_a + 1.0 / big_c)
    if d > 1:
        if iso_0 <= 0.0 or iso_1 <= 0.0:
            return math.inf
        total += (d - 1) * (iso_0 - iso_1) ** 2 / (iso_0 * iso_1)
    return total


def objective(
    lam10: float, lam20: float, lam11: float, lam21: float, u: float, v: float, d: int, g: float
) -> float:
    """The objective of Thm 2 (Li et al.); sumKL = objective/2 − d."""
    return 2.0 * d + sumkl_excess((lam10, lam20, lam11, lam21), u, v, d, g)


def solve(
    u: float, v: float, g: float, p: float, d: int, P: float, tol: float = 1e-7, max_iter: int = 200
) -> MarvellSolution:
    """Minimise sumKL over (λ₁⁰, λ₂⁰, λ₁¹, λ₂¹) under the power budget P (used with equality).

    u, v: negative / positive per-coordinate variance; g = ‖Δg‖² > 0; p: positive fraction in
    (0, 1); d: dimension; P ≥ 0. u = v = 0 has a closed form (the model is then 1-D along Δg,
    so sumKL = objective/2 − 1). Otherwise λ₂¹ = 0 if u < v, else λ₂⁰ = 0, and the other three
    are found by alternating exact minimisation along the constraint line of one pair at a time
    (closed form for the (λ₁⁰, λ₁¹) pair, safeguarded Newton for the others), until a sweep
    lowers sumKL by less than tol relative, or after max_iter sweeps.
    """
    if not (g > 0.0 and 0.0 < p < 1.0 and d >= 1 and P >= 0.0 and u >= 0.0 and v >= 0.0):
        raise ValueError(f"marvell solver: bad instance u={u} v={v} g={g} p={p} d={d} P={P}")
    # The objective is invariant to scaling (u, v, g, λ) together: solve with g = 1.
    un, vn, pn = u / g, v / g, P / g
    weights = (1.0 - p, (1.0 - p) * (d - 1), p, p * (d - 1))  # power = weights·λ
    if un == 0.0 and vn == 0.0:
        a, c = _best_on_along_pair((0.0, 0.0, 0.0, 0.0), un, vn, p, 1, pn)
        lam = (a, 0.0, c, 0.0)
        excess = sumkl_excess(lam, un, vn, 1, 1.0)
        return _solution(lam, g, 2.0 + excess, 0.5 * excess, 0)
    iso_free = 1 if un < vn else 3  # index of the isotropic λ that may be non-zero
    lam = _initial_point(iso_free if d > 1 else None, weights, pn)
    excess = sumkl_excess(lam, un, vn, d, 1.0)
    sweeps = 0
    if d > 1 and pn > 0.0:
        along = 0 if iso_free == 1 else 2  # the along-Δg λ of the same class as iso_free
        other = 2 if along == 0 else 0
        pairs = ((iso_free, along), (iso_free, other))
        while sweeps < max_iter:
            sweeps += 1
            a, c = _best_on_along_pair(lam, un, vn, p, d, pn)
            lam = (a, lam[1], c, lam[3])
            for pair in pairs:
                lam = _line_minimise(lam, pair, weights, un, vn, d)
            new_excess = sumkl_excess(lam, un, vn, d, 1.0)
            if excess - new_excess <= tol * new_excess:
                excess = min(excess, new_excess)
                break
            excess = new_excess
    elif pn > 0.0:
        a, c = _best_on_along_pair(lam, un, vn, p, d, pn)
        lam = (a, 0.0, c, 0.0)
        excess = sumkl_excess(lam, un, vn, d, 1.0)
    return _solution(lam, g, 2.0 * d + excess, 0.5 * excess, sweeps)


def _solution(lam, g, objective_value, sumkl, iterations) -> MarvellSolution:
    a, b, c, e = (x * g for x in lam)
    return MarvellSolution(a, b, c, e, objective_value, sumkl, iterations)


def _initial_point(iso_free: int | None, weights, budget: float):
    """An interior point using the whole budget: equal values on the free variables."""
    if iso_free is None:
        x = budget / (weights[0] + weights[2])
        return (x, 0.0, x, 0.0)
    x = budget / (weights[0] + weights[2] + weights[iso_free])
    lam = [x, 0.0, x, 0.0]
    lam[iso_free] = x
    return tuple(lam)


def _best_on_along_pair(lam, u, v, p, d, budget):
    """Exact minimiser over (λ₁⁰, λ₁¹) with the isotropic λ fixed, g = 1.

    With A = λ₁⁰ + u, C = λ₁¹ + v and pC + (1−p)A = K fixed, the along-Δg part of the objective
    is a convex function of r = C/A minimised at r² = (K + 1 − p)/(K + p); the constraints
    λ₁⁰ ≥ λ₂⁰, λ₁¹ ≥ λ₂¹ cut the line to a segment, so the minimiser is clamped to it.
    """
    _, b, _, e = lam
    left = max(budget - (d - 1) * ((1.0 - p) * b + p * e), 0.0)  # = p·λ₁¹ + (1−p)·λ₁⁰
    k = left + p * v + (1.0 - p) * u
    r = math.sqrt((k + 1.0 - p) / (k + p))
    a_new = k / (p * r + 1.0 - p) - u
    a_lo, a_hi = b, (left - p * e) / (1.0 - p)  # from λ₁⁰ ≥ λ₂⁰ and λ₁¹ ≥ λ₂¹
    if a_hi < a_lo:  # only rounding can do this; the pair has no room to move
        a_hi = a_lo
    a_new = min(max(a_new, a_lo), a_hi)
    c_new = max((left - (1.0 - p) * a_new) / p, e)
    return a_new, c_new


def _line_minimise(lam, pair, weights, u, v, d):
    """Exact minimum of the objective on the segment that moves lam[i], lam[j] at fixed power."""
    i, j = pair
    direction = [0.0, 0.0, 0.0, 0.0]
    direction[i], direction[j] = weights[j], -weights[i]
    a, b, c, e = lam
    da, db, dc, de = direction
    lo, hi = 0.0, 0.0  # the current point is feasible (up to rounding)
    lo_set = hi_set = False
    for value, slope in ((a, da), (b, db), (c, dc), (e, de), (a - b, da - db), (c - e, dc - de)):
        if slope > 0.0:
            bound = -value / slope
            if not lo_set or bound > lo:
                lo, lo_set = bound, True
        elif slope < 0.0:
            bound = -value / slope
            if not hi_set or bound < hi:
                hi, hi_set = bound, True
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    t = _convex_argmin(_ratio_terms(lam, direction, u, v, d), lo, hi)
    return (max(a + t * da, 0.0), max(b + t * db, 0.0), max(c + t * dc, 0.0), max(e + t * de, 0.0))


def _ratio_terms(lam, direction, u, v, d):
    """The objective along lam + t·direction as Σ k·(n0 + n1·t)/(m0 + m1·t)."""
    a, b, c, e = lam
    da, db, dc, de = direction
    iso = float(d - 1)
    return (
        (iso, b + u, db, e + v, de),
        (iso, e + v, de, b + u, db),
        (1.0, a + u + 1.0, da, c + v, dc),
        (1.0, c + v + 1.0, dc, a + u, da),
    )


def _slope(terms, t):
    """First and second derivative of the objective along the line at t (inf at a pole)."""
    first = second = 0.0
    for k, n0, n1, m0, m1 in terms:
        if k == 0.0:
            continue
        den = m0 + m1 * t
        if den <= 0.0:
            return (math.inf if m1 < 0.0 else -math.inf), math.inf
        cross = n1 * den - (n0 + n1 * t) * m1  # numerator of d/dt (n/m), times m²
        first += k * cross / (den * den)
        second -= 2.0 * k * m1 * cross / (den * den * den)
    return first, second


def _convex_argmin(terms, lo, hi):
    """Minimiser on [lo, hi] of a convex sum of ratios: the root of its slope, or an end."""
    slope_lo, _ = _slope(terms, lo)
    if slope_lo >= 0.0:
        return lo
    slope_hi, _ = _slope(terms, hi)
    if slope_hi <= 0.0:
        return hi
    t = 0.0 if lo < 0.0 < hi else 0.5 * (lo + hi)
    for _ in range(_NEWTON_MAX_STEPS):
        slope, curvature = _slope(terms, t)
        if slope > 0.0:
            hi = t
        elif slope < 0.0:
            lo = t
        else:
            return t
        step = t - slope / curvature if curvature > 0.0 and math.isfinite(curvature) else None
        if step is None or not lo < step < hi:
            step = 0.5 * (lo + hi)
        if abs(step - t) <= 1e-15 * max(1.0, abs(t)) or hi - lo <= 1e-15 * max(1.0, abs(t)):
            return step
        t = step
    return t
