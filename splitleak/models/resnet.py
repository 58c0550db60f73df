"""ResNet bottoms from torchvision's implementation, adapted to a party's image strip.

Fu et al.'s CIFAR bottoms: torchvision's ResNet-18 / 34 with the CIFAR stem (a 3×3 stride-1
first convolution, no max-pool) and no classifier, so the cut is the 512-d pooled features;
adaptive pooling takes any strip width (e.g. a 3×32×16 half image). No pre-trained weights."""

from __future__ import annotations

import sys
from types import ModuleType

import torch
from torch import nn

DEPTHS = (18, 34)
RESNET_FEATURES = 512  # the pooled features of ResNet-18 and -34: the cut


def torchvision_models() -> ModuleType:
    """`torchvision.models`, also beside a CPU-only torch.

    PyPI's torchvision wheels link their C++ operators (nms, roi_align, …) against a CUDA
    build of torch; beside the CPU wheel that library fails to load, and torchvision's import
    then stops at registering a fake kernel for the missing `torchvision::nms`. The models
    use none of those operators: declaring the two schemas that import needs lets it finish,
    and any call of the operators themselves still fails, naming them."""
    try:
        import torchvision.models
    except RuntimeError as err:
        if "torchvision::nms" not in str(err):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _KEEP.append(library)
        import torchvision.models
    return torchvision.models


_KEEP: list[object] = []  # the schema library must outlive the import


def resnet_body(depth: int, in_channels: int) -> nn.Module:
    """The ResNet up to its pooled features ([B, 512]) with the CIFAR stem."""
    if depth not in DEPTHS:
        raise ValueError(f"model.depth = {depth}: torchvision's ResNet depths here are {DEPTHS}")
    models = torchvision_models()
    body = getattr(models, f"resnet{depth}")(weights=None)
    body.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    body.maxpool = nn.Identity()
    body.fc = nn.Identity()
    return body
