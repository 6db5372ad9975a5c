"""Record a small real capture (raw M and F records) as a JSON test fixture.

    python tests/record_fixture.py --device cuda --out tests/data/resnet18_train_cuda/raw.json

The fixture holds exactly what the levels drained, so tests can run conversion on real data
without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import capture_raw, to_json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    steps, framework, meta = capture_raw(
        args.model, args.mode, args.batch_size, args.device, args.iterations
    )
    fw = to_json(framework)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"meta": meta, "steps": asdict(steps), "framework": fw}, separators=(",", ":"))
    )
    print(f"wrote {out}: {len(framework.name)} events, {len(steps.iteration)} iterations")


if __name__ == "__main__":
    main()
