"""Training objectives of the label party; importing this package registers every one."""

from label_party.objectives import (  # noqa: F401  (imported to register)
    cae,
    cross_entropy,
    dcor,
    gafm,
    kdk,
    label_dp,
    mid,
    pe_loss,
)
from label_party.objectives.base import (
    OBJECTIVES,
    Objective,
    ObjectiveError,
    ObjectiveSetup,
    StepResult,
    build_objective,
    supervised_loss,
)

__all__ = ["OBJECTIVES", "Objective", "ObjectiveError", "ObjectiveSetup", "StepResult", "build_objective",
           "supervised_loss"]
