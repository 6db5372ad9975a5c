"""The model zoo: torchvision, timm and transformers models by name, with random weights and
synthetic inputs of the right shape. Nothing is downloaded: every model is built from code and a
default configuration.

Names are ``SOURCE:NAME``: ``torchvision:resnet50``, ``timm:vit_base_patch16_224``,
``transformers:bert``; ``xsp.tracer.workloads.names`` knows them without importing torch. A
workload is one model with its inputs, loss and optimizer; ``step()`` runs one iteration (a
forward pass, or forward, backward and optimizer step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

from xsp.core.errors import ConfigError, WorkloadError
from xsp.tracer.workloads import names
from xsp.tracer.workloads.names import MODES, ZooEntry, find

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_LR",
    "TEXT_SEQUENCE_LENGTH",
    "ModelInputs",
    "Workload",
    "build",
    "transformers_config",
]

log = logging.getLogger(__name__)

DEFAULT_IMAGE_SIZE = 224
TEXT_SEQUENCE_LENGTH = 128
DEFAULT_LR = 0.01


#: A model's synthetic inputs: keyword tensors (transformers' models) or positional ones.
ModelInputs: TypeAlias = dict[str, torch.Tensor] | tuple[torch.Tensor, ...]


class Workload:
    """A model, its synthetic inputs, its loss and (for training) its optimizer."""

    def __init__(
        self,
        entry: ZooEntry,
        model: torch.nn.Module,
        inputs: ModelInputs,
        loss: Callable[[Any], torch.Tensor],
        mode: str,
        device: torch.device,
    ) -> None:
        self.entry = entry
        self.model = model
        self.inputs = inputs
        self.loss = loss
        self.mode = mode
        self.device = device
        self.optimizer = (
            torch.optim.SGD(model.parameters(), lr=DEFAULT_LR, momentum=0.9)
            if mode == "train"
            else None
        )

    def forward(self) -> Any:
        """The model called on its inputs."""
        if isinstance(self.inputs, dict):
            return self.model(**self.inputs)
        return self.model(*self.inputs)

    def step(self) -> None:
        """One iteration: a forward pass (infer), or forward, loss, backward, optimizer step."""
        if self.optimizer is None:
            with torch.inference_mode():
                self.forward()
            return
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.forward())
        loss.backward()
        self.optimizer.step()


def _mean_of_outputs(output: Any) -> torch.Tensor:
    """A scalar loss that touches every floating output (logits, hidden states, aux heads)."""
    tensors: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                tensors.append(value.float().mean())
        elif isinstance(value, dict) or hasattr(value, "values"):
            for item in value.values():
                collect(item)
        elif isinstance(value, (tuple, list)):
            for item in value:
                collect(item)

    collect(output)
    if not tensors:
        raise WorkloadError("the model returned no floating-point tensor to train on")
    return torch.stack(tensors).sum()


def build(
    name: str,
    batch_size: int,
    mode: str = "infer",
    device: str = "cpu",
    channels_last: bool = False,
) -> Workload:
    """Build a zoo workload; raise WorkloadError naming the model when that fails.
    ``channels_last`` stores weights and 4-d inputs NHWC (torch.channels_last)."""
    if mode not in MODES:
        raise ConfigError(f"bad mode {mode!r}: use train or infer")
    if batch_size < 1:
        raise ConfigError(f"bad batch size {batch_size}: must be at least 1")
    entry = find(name)
    torch.manual_seed(0)
    dev = torch.device(device)
    try:
        model, inputs = _build_on(dev, entry, batch_size)
    except WorkloadError:
        raise
    except Exception as exc:
        raise WorkloadError(f"cannot build {name}: {type(exc).__name__}: {exc}") from exc
    model = model.to(dev).train(mode == "train")
    inputs = _to_device(inputs, dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = _channels_last(inputs)
    if entry.task == "classification" and entry.source == "torchvision" and mode == "train":
        labels = torch.randint(0, 1000, (batch_size,), device=dev)
        loss: Callable[[Any], torch.Tensor] = lambda out: torch.nn.functional.cross_entropy(  # noqa: E731
            out if isinstance(out, torch.Tensor) else out[0], labels
        )
    else:
        loss = _mean_of_outputs
    return Workload(entry, model, inputs, loss, mode, dev)


def _build_on(dev: torch.device, entry: ZooEntry, batch_size: int) -> tuple[torch.nn.Module, Any]:
    """Build the model with its parameters created, and randomly initialized, on ``dev``: the
    CPU needs seconds for large models (VGG-16 2.4 s, ResNeXt-101 1.6 s on the 2-core dev
    machine), in every level-set process. A builder that cannot run there (CPU-only tensors in
    its code) is built on the CPU and moved."""
    builder = _BUILDERS[entry.source]
    if dev.type == "cpu":
        return builder(entry, batch_size)
    try:
        with dev:
            return builder(entry, batch_size)
    except WorkloadError:
        raise
    except Exception as exc:
        log.debug("building %s on %s failed (%s); building on the CPU", entry.qualified, dev, exc)
        torch.manual_seed(0)
        return builder(entry, batch_size)


def _channels_last(inputs: Any) -> Any:
    def convert(v: Any) -> Any:
        return v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v

    if isinstance(inputs, dict):
        return {k: convert(v) for k, v in inputs.items()}
    return tuple(convert(v) for v in inputs)


def _to_device(inputs: Any, dev: torch.device) -> Any:
    if isinstance(inputs, dict):
        return {k: v.to(dev) for k, v in inputs.items()}
    return tuple(v.to(dev) for v in inputs)


def _image(batch_size: int, size: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch_size, 3, size, size),)


def _torchvision(entry: ZooEntry, batch_size: int) -> tuple[torch.nn.Module, Any]:
    from torchvision import models

    kwargs: dict[str, bool | None] = {"weights": None}
    if entry.task == "segmentation":
        kwargs["weights_backbone"] = None
    if entry.name in ("googlenet", "inception_v3"):
        kwargs["init_weights"] = False  # scipy-based truncated-normal init is slow and optional
    size = DEFAULT_IMAGE_SIZE
    try:
        min_size = models.get_model_weights(entry.name).DEFAULT.meta.get("min_size")
        if min_size:
            size = max(size, *min_size)
    except (ValueError, AttributeError):
        pass
    if entry.name == "inception_v3":
        size = 299
    return models.get_model(entry.name, **kwargs), _image(batch_size, size)


def _timm(entry: ZooEntry, batch_size: int) -> tuple[torch.nn.Module, Any]:
    import timm

    model = timm.create_model(entry.name, pretrained=False)
    config = getattr(model, "pretrained_cfg", {})  # timm's settings of the model: a dict
    _, height, width = config.get("input_size", (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE))
    return model, (torch.randn(batch_size, 3, height, width),)


def _transformers(entry: ZooEntry, batch_size: int) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoConfig, AutoModel

    config = transformers_config(entry, AutoConfig)
    model = AutoModel.from_config(config)
    if entry.task == "vision":
        size = getattr(config, "image_size", DEFAULT_IMAGE_SIZE)
        return model, {"pixel_values": torch.randn(batch_size, 3, size, size)}
    vocab = getattr(config, "vocab_size", 30000)
    _, _, length = names.TRANSFORMERS_SIZED.get(entry.name, ("", {}, TEXT_SEQUENCE_LENGTH))
    ids = torch.randint(0, vocab, (batch_size, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if entry.task == "seq2seq":
        inputs["decoder_input_ids"] = ids.clone()
    return model, inputs


def transformers_config(entry: ZooEntry, auto_config: Any) -> Any:
    """A transformers family's default configuration, or a sized entry's."""
    model_type, overrides, _ = names.TRANSFORMERS_SIZED.get(entry.name, (entry.name, {}, 0))
    return auto_config.for_model(model_type, **overrides)


_BUILDERS: dict[str, Callable[[ZooEntry, int], tuple[torch.nn.Module, Any]]] = {
    "torchvision": _torchvision,
    "timm": _timm,
    "transformers": _transformers,
}
