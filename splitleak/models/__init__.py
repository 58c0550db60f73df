"""The model zoo: bottom models for every party, the label party's top model."""

from splitleak.models.build import (
    Bottom,
    InputSpec,
    TopModel,
    build_bottom,
    build_top,
    input_spec,
)
from splitleak.models.layers import Bottleneck

__all__ = [
    "Bottleneck",
    "Bottom",
    "InputSpec",
    "TopModel",
    "build_bottom",
    "build_top",
    "input_spec",
]
