"""Training objectives of the label party; importing this package registers every one."""

from label_party.objectives import cross_entropy  # noqa: F401  (imported to register)
from label_party.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveSetup,
    StepResult,
    build_objective,
    supervised_loss,
)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveSetup", "StepResult", "build_objective",
           "supervised_loss"]
