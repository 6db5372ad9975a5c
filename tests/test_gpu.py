"""GPU-only checks, run on the device machine; they skip cleanly without a GPU."""

from __future__ import annotations

import pyarrow.compute as pc

from tests.conftest import reachable_from_root
from tracer import zoo
from tracer.session import Session
from tracer.sinks import InMemorySink


def test_mf_training_on_cuda_nests_and_attributes_backward(cuda_device: str) -> None:
    workload = zoo.build("torchvision:resnet18", 4, "train", cuda_device)
    sink = InMemorySink()
    session = Session("MF", iterations=2, warmup=1, sinks=[sink], device=cuda_device).start()
    while not session.done:
        with session.iteration():
            workload.step()
    meta = session.close()
    table = sink.table()
    assert meta is not None and meta["status"] == "ok"
    assert pc.sum(pc.equal(table.column("kind"), "step")).as_py() == 2
    assert reachable_from_root(table)
    names = {n for n, _ in workload.model.named_modules()}
    paths = {p for p in table.column("module_path").to_pylist() if p is not None}
    assert paths <= names
    backward = table.filter(pc.equal(table.column("kind"), "backward"))
    attributed = backward.filter(pc.is_valid(backward.column("module_path")))
    # every conv and linear layer's gradient node is attributed to its layer
    assert {"conv1", "fc", "layer4.1.conv2"} <= set(attributed.column("module_path").to_pylist())
