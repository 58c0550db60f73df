"""DP Gaussian on cut gradients (Qiu et al.): clip each row to norm C, add N(0, (σC)²·I)."""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field, model_validator

from label_party.defenses.base import DEFENSES, Defense, DefenseContext, DefenseParams
from label_party.defenses.rows import as_rows, compute_dtype, is_empty, restore, row_norms
from splitleak.settings import MAX_SCALE

EPSILON_COVERS = (
    "per-example label DP of the cut-gradient rows one passive party receives, alone: the "
    "Gaussian mechanism on one example's clipped row, L2 sensitivity 2C (changing the label "
    "may move the row anywhere in the C-ball), i.e. noise multiplier σ/2, composed (RDP "
    "accountant) once per epoch seen, as each row is released once per epoch; no "
    "amplification by sampling, since the passive party knows which sample ids are in each "
    "batch. It does not cover what leaks through the label party's model parameters (trained "
    "on clean labels) into later gradients."
)
ADAPTIVE_CAVEAT = (
    " With adaptive clipping C = 0.5 × the batch's median row norm is itself data-dependent "
    "and not privatised, so this ε is nominal."
)
QUANTILE_CAVEAT = (
    " With adaptive clipping C = the batch's {q} quantile of row norms is itself data-dependent "
    "and not privatised, so this ε is nominal."
)
ALL_PARTIES_COVERS = (
    "ε over every passive party's rows of an example together (its label shapes the row each "
    "party receives, once per epoch): what all passive parties colluding learn; `epsilon` is "
    "what one party alone learns."
)
AMPLIFIED_CAVEAT = (
    "RDP of the Poisson-subsampled Gaussian (rate q = sampling_rate, multiplier σ/2) composed "
    "over every step seen; valid only if batches were Poisson-sampled and their membership "
    "hidden from the receiver, which split learning does not give: a what-if figure."
)


class DpGaussianParams(DefenseParams):
    clip: float | None = Field(default=None, gt=0.0, le=MAX_SCALE)  # fixed clipping norm C
    adaptive: bool = False  # C = 0.5 × median row norm of each batch ("half the gradient norm")
    # With adaptive: None keeps 0.5 × median; q sets C = the batch's q-quantile of row norms
    # (Andrew et al.'s target quantile, read as the batch's own; ALGORITHMS.md §3.6).
    adaptive_quantile: float | None = Field(default=None, gt=0.0, le=1.0)
    noise_multiplier: float = Field(ge=0.0, le=MAX_SCALE)  # σ: noise std = σ·C per coordinate
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    sampling_rate: float | None = Field(default=None, gt=0.0, le=1.0)  # batch_size / train rows

    @model_validator(mode="after")
    def _one_clip_rule(self) -> DpGaussianParams:
        if (self.clip is None) == (not self.adaptive):
            raise ValueError("give exactly one of clip (a fixed C) or adaptive = true")
        if self.adaptive_quantile is not None and not self.adaptive:
            raise ValueError("adaptive_quantile needs adaptive = true (with a fixed clip there is "
                             "no quantile to take)")
        return self


@DEFENSES.register("dp_gaussian")
class DpGaussian(Defense):
    """g̃_j = g_j·min(1, C/‖g_j‖) + N(0, (σC)²·I_d); summary() gives ε at δ (EPSILON_COVERS)."""

    name = "dp_gaussian"
    Params = DpGaussianParams
    params: DpGaussianParams

    def __init__(self, params: DpGaussianParams) -> None:
        super().__init__(params)
        self._epochs: set[int] = set()
        self._steps = 0

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        if is_empty(cut_gradient):
            return cut_gradient
        self._epochs.add(ctx.epoch)
        self._steps += 1
        rows = as_rows(cut_gradient)
        work = compute_dtype(rows.dtype)
        norms = row_norms(rows)
        if self.params.clip is not None:
            clip = self.params.clip
        elif self.params.adaptive_quantile is None:
            clip = 0.5 * float(norms.median())
        else:  # linear interpolation between order statistics (numpy's default)
            clip = float(torch.quantile(norms, self.params.adaptive_quantile))
        ctx.diagnostics["dp_gaussian.clip"] = clip
        factor = torch.where(norms > clip, clip / torch.where(norms > 0, norms, 1.0), 1.0)
        noise = torch.randn(rows.shape, generator=ctx.generator, dtype=work).to(rows.device)
        clipped = rows.to(work) * factor.to(work).unsqueeze(1)
        noisy = torch.add(clipped, noise, alpha=self.params.noise_multiplier * clip)
        return restore(noisy, cut_gradient)

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": sorted(self._epochs), "steps": self._steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epochs = {int(e) for e in state["epochs"]}
        self._steps = int(state["steps"])

    def _clip_rule(self) -> str | float | None:
        if not self.params.adaptive:
            return self.params.clip
        q = self.params.adaptive_quantile
        return "adaptive" if q is None else f"adaptive (quantile {q:g})"

    def _caveat(self) -> str:
        if not self.params.adaptive:
            return ""
        q = self.params.adaptive_quantile
        return ADAPTIVE_CAVEAT if q is None else QUANTILE_CAVEAT.format(q=f"{q:g}")

    def epsilon(self) -> float:
        """ε at δ of the per-row mechanism over the epochs seen (see EPSILON_COVERS)."""
        return _rdp_epsilon(self.params.noise_multiplier, len(self._epochs), self.params.delta)

    @classmethod
    def joint_summary(cls, instances: list[Defense]) -> dict[str, Any]:
        if len(instances) < 2:
            return {}
        released = sum(len(d._epochs) for d in instances if isinstance(d, DpGaussian))
        params = instances[0].params
        assert isinstance(params, DpGaussianParams)
        return {"epsilon_all_parties": _rdp_epsilon(params.noise_multiplier, released, params.delta),
                "parties_composed": len(instances), "epsilon_all_parties_covers": ALL_PARTIES_COVERS}

    def summary(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "epsilon": self.epsilon(),
            "delta": self.params.delta,
            "noise_multiplier": self.params.noise_multiplier,
            "clip": self._clip_rule(),
            "epochs_seen": len(self._epochs),
            "steps_seen": self._steps,
            "epsilon_covers": EPSILON_COVERS + self._caveat(),
        }
        if self.params.noise_multiplier == 0.0:
            report["epsilon_note"] = "infinite: noise_multiplier = 0 adds no noise (clipping only)"
        if self.params.sampling_rate is not None:
            report["epsilon_if_poisson_sampled"] = _rdp_epsilon(
                self.params.noise_multiplier,
                self._steps,
                self.params.delta,
                self.params.sampling_rate,
            )
            report["epsilon_if_poisson_sampled_covers"] = AMPLIFIED_CAVEAT
        return report


def _rdp_epsilon(sigma: float, count: int, delta: float, rate: float | None = None) -> float:
    if count == 0:
        return 0.0
    if sigma == 0.0:
        return math.inf
    import dp_accounting  # (scipy.stats and scipy.signal come with it: ~1 s, at the summary only)

    event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(sigma / 2.0)
    if rate is not None:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, count))
    return float(accountant.get_epsilon(delta))
