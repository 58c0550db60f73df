"""Construct bottoms and tops from the config, seeded, with shapes checked at build time."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from splitleak.config import ModelConfig
from splitleak.datasets.base import Schema
from splitleak.models.layers import FieldEncoder, conv_blocks, relu_stack
from splitleak.models.resnet import RESNET_FEATURES, resnet_body


@dataclass(frozen=True)
class InputSpec:
    """What one party's columns look like to a model."""

    num_numeric: int
    cardinalities: tuple[int, ...]
    image_shape: tuple[int, int, int] | None = None  # (C, H, width of the strip)


def input_spec(schema: Schema, columns: tuple[int, int]) -> InputSpec:
    start, stop = columns
    if schema.image_shape is not None:
        c, h, _ = schema.image_shape
        return InputSpec(0, (), (c, h, stop - start))
    p = len(schema.numeric_names)
    num_numeric = max(0, min(stop, p) - start)
    cats = schema.cardinalities[max(start, p) - p: max(stop, p) - p]
    return InputSpec(num_numeric, tuple(cats))


class Bottom(nn.Module):
    """A party's model up to the cut layer: (numeric, categorical) -> activation."""

    def __init__(self, encoder: FieldEncoder | None, body: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.body = body

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        x = self.encoder(numeric, categorical) if self.encoder is not None else numeric
        return self.body(x)


class Wide(nn.Module):
    """The wide part of Wide&Deep: a linear model over raw numerics and 1-dim field weights."""

    def __init__(self, spec: InputSpec, outputs: int) -> None:
        super().__init__()
        self.encoder = FieldEncoder(spec.num_numeric, spec.cardinalities, outputs, init_std=0.0)
        self.numeric = nn.Linear(spec.num_numeric, outputs) if spec.num_numeric else None
        self.bias = nn.Parameter(torch.zeros(outputs))
        self.fields = len(spec.cardinalities)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        out = self.bias.expand(numeric.shape[0], -1)
        if self.numeric is not None:
            out = out + self.numeric(numeric)
        for i, emb in enumerate(self.encoder.embeddings):
            out = out + emb(categorical[:, i])
        return out


def aggregate(parts: list[torch.Tensor], how: str) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    if how == "concat":
        return torch.cat(parts, dim=-1)  # features (2-D) or image width (4-D)
    stacked = torch.stack(parts)
    return stacked.sum(0) if how == "sum" else stacked.mean(0)


class TopModel(nn.Module):
    """The label party's side: aggregation of the activations, its own part, the head."""

    def __init__(self, aggregation: str, head: nn.Module | None,
                 own_bottom: nn.Module | None = None, wide: nn.Module | None = None) -> None:
        super().__init__()
        self.aggregation = aggregation
        self.head = head
        self.own_bottom = own_bottom
        self.wide = wide

    def forward(self, activations: list[torch.Tensor], own_numeric: torch.Tensor | None = None,
                own_categorical: torch.Tensor | None = None) -> torch.Tensor:
        parts = list(activations)
        if self.own_bottom is not None:
            parts.append(self.own_bottom(own_numeric, own_categorical))
        out = aggregate(parts, self.aggregation)
        if self.head is not None:
            out = self.head(out)
        if self.wide is not None:
            out = out + self.wide(own_numeric, own_categorical)
        return out


def _bottom(cfg: ModelConfig, spec: InputSpec, outputs: int) -> Bottom:
    if cfg.kind == "resnet":
        if spec.image_shape is None:
            raise ValueError("model.kind = 'resnet' needs an image dataset (e.g. cifar10)")
        body: nn.Module = resnet_body(cfg.depth, spec.image_shape[0])
        if cfg.top == "none":
            body = nn.Sequential(body, nn.Linear(RESNET_FEATURES, outputs))
        return Bottom(None, body)
    if cfg.kind == "cnn":
        if spec.image_shape is None:
            raise ValueError("model.kind = 'cnn' needs an image dataset (e.g. digits)")
        body = conv_blocks(spec.image_shape[0], cfg.channels[: cfg.cut_layer])
        fc = cfg.cut_layer - len(cfg.channels)
        if fc > 0:  # the cut lies in the fully connected layers (Fu et al.'s bottoms end in fc)
            flat = _numel(_shape_after(body, (1, *spec.image_shape)))
            body = nn.Sequential(body, nn.Flatten(), relu_stack(flat, cfg.layers[:fc])[0])
        if cfg.top == "none":
            shape = _shape_after(body, (1, *spec.image_shape))
            body = nn.Sequential(body, nn.Flatten(), nn.Linear(_numel(shape), outputs))
        return Bottom(None, body)
    if spec.image_shape is not None:
        encoder: nn.Module = nn.Flatten()
        width = spec.image_shape[0] * spec.image_shape[1] * spec.image_shape[2]
        stack, width = relu_stack(width, cfg.layers[: cfg.cut_layer])
        layers = [stack] if cfg.top == "mlp" else [stack, nn.Linear(width, outputs)]
        return Bottom(None, nn.Sequential(encoder, *layers))
    field_encoder = FieldEncoder(spec.num_numeric, spec.cardinalities, cfg.embedding_dim)
    stack, width = relu_stack(field_encoder.out_features, cfg.layers[: cfg.cut_layer])
    body = stack if cfg.top == "mlp" else nn.Sequential(stack, nn.Linear(width, outputs))
    return Bottom(field_encoder, body)


def _shape_after(module: nn.Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of one zero example, in eval mode (batch norm takes a single row then,
    and its running statistics stay untouched)."""
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return tuple(module(torch.zeros(shape)).shape[1:])
    finally:
        module.train(training)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def build_bottom(cfg: ModelConfig, spec: InputSpec, outputs: int, seed: int) -> Bottom:
    """A passive party's (or the label party's own) bottom model, initialised from `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _bottom(cfg, spec, outputs)


def build_top(cfg: ModelConfig, activation_shapes: list[tuple[int, ...]],
              own_spec: InputSpec | None, outputs: int, seed: int) -> TopModel:
    """The label party's model given every passive party's activation shape (batch dim off)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        own_bottom = wide = None
        shapes = list(activation_shapes)
        if own_spec is not None and cfg.kind == "wide_deep":
            wide = Wide(own_spec, outputs)
        elif own_spec is not None:
            own_bottom = _bottom(cfg, own_spec, outputs)
            shapes.append(_shape_after(own_bottom.body, (1, *_own_input_shape(own_bottom, own_spec))))
        _check_shapes(cfg, shapes)
        if cfg.top == "none":
            return TopModel("sum", None, own_bottom, wide)
        merged = _merged_shape(shapes, cfg.aggregation)
        head: nn.Module
        if cfg.kind == "resnet":  # Fu et al.'s top: fully connected layers on the features
            stack, width = relu_stack(_numel(merged), cfg.layers)
            head = nn.Sequential(nn.Flatten(), stack, nn.Linear(width, outputs))
        elif cfg.kind == "cnn" and cfg.cut_layer > len(cfg.channels):
            stack, width = relu_stack(_numel(merged), cfg.layers[cfg.cut_layer - len(cfg.channels):])
            head = nn.Sequential(nn.Flatten(), stack, nn.Linear(width, outputs))
        elif cfg.kind == "cnn":
            convs = conv_blocks(merged[0], cfg.channels[cfg.cut_layer:])
            flat = _numel(_shape_after(convs, (1, *merged)))
            stack, width = relu_stack(flat, cfg.layers)
            head = nn.Sequential(convs, nn.Flatten(), stack, nn.Linear(width, outputs))
        else:
            stack, width = relu_stack(_numel(merged), cfg.layers[cfg.cut_layer:])
            head = nn.Sequential(nn.Flatten(), stack, nn.Linear(width, outputs))
        return TopModel(cfg.aggregation, head, own_bottom, wide)


def _own_input_shape(bottom: Bottom, spec: InputSpec) -> tuple[int, ...]:
    if spec.image_shape is not None:
        return spec.image_shape
    assert isinstance(bottom.encoder, FieldEncoder)
    return (bottom.encoder.out_features,)


def _check_shapes(cfg: ModelConfig, shapes: list[tuple[int, ...]]) -> None:
    if cfg.aggregation in ("sum", "mean") or cfg.top == "none":
        if len(set(shapes)) > 1:
            raise ValueError(f"aggregation '{cfg.aggregation}' needs equal activation shapes, "
                             f"got {shapes}")
    elif len({s[:-1] for s in shapes}) > 1:
        raise ValueError(f"aggregation 'concat' needs activations that differ only in the last "
                         f"dimension, got {shapes}")


def _merged_shape(shapes: list[tuple[int, ...]], how: str) -> tuple[int, ...]:
    if how != "concat":
        return shapes[0]
    return (*shapes[0][:-1], sum(s[-1] for s in shapes))
