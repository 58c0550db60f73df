"""The label party's finiteness check and a party's row gather: fast paths that must answer
exactly as the plain operations they replace."""

from __future__ import annotations

import pytest
import torch

from label_party.trainer import all_finite
from splitleak.inputs import PartyInputs
from splitleak.models.build import InputSpec


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_one_non_finite_value_anywhere_is_caught(bad: float, dtype: torch.dtype) -> None:
    gradient = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert all_finite(gradient)
    for index in [(0, 0), (17, 3), (63, 7)]:
        spoiled = gradient.clone()
        spoiled[index] = bad
        assert not all_finite(spoiled)


def test_inf_and_minus_inf_together_are_caught() -> None:
    gradient = torch.zeros(4, 4)
    gradient[0, 0], gradient[3, 3] = float("inf"), float("-inf")  # their sum is NaN
    assert not all_finite(gradient)


def test_finite_values_whose_sum_overflows_are_finite() -> None:
    big = torch.full((8, 4), torch.finfo(torch.float32).max / 2)
    assert not torch.isfinite(big.sum())  # the fast path fails: the full check answers
    assert all_finite(big)
    assert all_finite(torch.zeros(0, 128))


def test_rows_gathers_exactly_what_indexing_does() -> None:
    g = torch.Generator().manual_seed(1)
    inputs = PartyInputs(torch.randn(50, 3, generator=g), torch.randint(0, 9, (50, 2), generator=g),
                         InputSpec(3, (9, 9)))
    ids = torch.tensor([4, 0, 49, 4, 17])
    numeric, categorical = inputs.rows(ids)
    assert torch.equal(numeric, inputs.numeric[ids])
    assert torch.equal(categorical, inputs.categorical[ids])
    grid = ids.view(5, 1)  # any other index shape is indexing's own
    assert torch.equal(inputs.rows(grid)[0], inputs.numeric[grid])
