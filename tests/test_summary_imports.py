"""``xsp summary`` imports no pandas (issue 31): pyarrow imports it, 0.3-0.7 s of a summary
that should answer within 1 s, wherever Python values become arrow values or arrow columns numpy
arrays; the summary's path builds its columns with ``xsp.core.columns`` instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "benchmarks" / "data" / "r50-b64-train"

_SCRIPT = """
import sys
from click.testing import CliRunner
from xsp.cli import main
result = CliRunner().invoke(main, ["summary", sys.argv[1]])
assert result.exit_code == 0, result.output
assert "layers by GPU time" in result.output, result.output
print("pandas" in sys.modules)
"""


def test_summary_of_a_stored_measurement_imports_no_pandas() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(STORE)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == "False"
