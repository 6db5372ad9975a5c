"""Names as the campaign report shows them: a model's family (for small multiples), a short label
for a chart axis, and a kernel's demangled name cut to what a reader scans for."""

from __future__ import annotations

import re

__all__ = ["FAMILIES", "family", "family_order", "labels"]

#: (family, pattern matched at the start of the model's name without its source); the first match
#: wins, so where prefixes overlap the earlier family takes the model (a ``mobilevit`` would be a
#: mobile CNN). A model nothing matches falls into "Other <source>".
FAMILIES: tuple[tuple[str, str], ...] = (
    ("ResNet and ResNeXt", r"(resnet|resnext|wide_resnet|cspresnet)"),
    ("VGG and AlexNet", r"(vgg|alexnet)"),
    ("DenseNet", r"densenet"),
    ("Inception and SqueezeNet", r"(googlenet|inception|squeezenet)"),
    ("RegNet", r"regnet"),
    ("EfficientNet", r"efficientnet"),
    ("Mobile CNNs", r"(mobilenet|mnasnet|shufflenet|ghostnet)"),
    ("ConvNeXt and MetaFormers", r"(convnext|edgenext|poolformer)"),
    ("Vision transformers", r"(vit|deit|swin|maxvit|levit|mixer)"),
    ("Segmentation", r"(fcn|deeplab|lraspp)"),
    ("Text encoders (BERT-like)", r"(bert|distilbert|roberta|albert|electra|mpnet)"),
    ("Text decoders and seq2seq", r"(gpt|xlnet|t5|bart)"),
)
_FAMILY_RES = tuple((family, re.compile(pattern)) for family, pattern in FAMILIES)
#: The longest kernel name shown before it is cut (after templates and arguments are elided).


def family(model: str) -> str:
    """``torchvision:resnet50`` -> ``ResNet and ResNeXt``. The name's prefix decides, so timm's
    and torchvision's ResNets share a family; unknown names fall into "Other <source>"."""
    source, _, name = model.rpartition(":")
    for label, pattern in _FAMILY_RES:
        if pattern.match(name.lower()):
            return label
    return f"Other {source or 'models'}"


def family_order() -> list[str]:
    """The families in the order the report lays out their panels."""
    return [label for label, _ in FAMILIES]


def labels(models: list[str]) -> dict[str, str]:
    """Short chart labels: the name without its source, unless two sources share the name
    (``efficientnet_b0 (timm)`` next to ``efficientnet_b0 (torchvision)``)."""
    names = [m.rpartition(":")[2] for m in models]
    out = {}
    for model, name in zip(models, names, strict=True):
        source = model.rpartition(":")[0]
        out[model] = f"{name} ({source})" if names.count(name) > 1 and source else name
    return out
