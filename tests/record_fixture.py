"""Record a small real capture as a JSON test fixture.

python tests/record_fixture.py --device cuda --levels MFLG --out tests/data/<scenario>/raw.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import (
    SECTIONS,
    capture_compiled_raw,
    capture_graphed_raw,
    capture_raw,
    to_json,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--levels", default="MF")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--cuda-graphs",
        choices=("graphed", "eager", "compiled-reduce-overhead", "compiled-default"),
        help="record tests/test_cuda_graphs.py's small CNN instead of a zoo model (MFLG, CUDA): "
        "trained with make_graphed_callables or eagerly, or inference torch.compile'd",
    )
    args = parser.parse_args()
    if args.cuda_graphs and args.cuda_graphs.startswith("compiled-"):
        mode = args.cuda_graphs.removeprefix("compiled-")
        drained, meta = capture_compiled_raw(mode, args.iterations)
    elif args.cuda_graphs:
        drained, meta = capture_graphed_raw(args.cuda_graphs == "graphed", args.iterations)
    else:
        drained, meta = capture_raw(
            args.model, args.mode, args.batch_size, args.device, args.iterations, args.levels
        )
    data = {"meta": meta, **{SECTIONS[letter]: to_json(r) for letter, r in drained.items()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, separators=(",", ":")))
    sizes = {
        letter: len(getattr(r, "start_ns", getattr(r, "iteration", [])))
        for letter, r in drained.items()
    }
    print(f"wrote {out}: records per level {sizes}")


if __name__ == "__main__":
    main()
