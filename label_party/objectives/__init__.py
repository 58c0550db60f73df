"""Training objectives of the label party; importing this package registers every one."""

from label_party.objectives import (  # noqa: F401  (imported to register)
    cross_entropy,
    gafm,
    kdk,
    label_dp,
)
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
