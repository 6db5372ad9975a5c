"""How long an HTML report takes to open in headless Chromium on this machine: for each page, in
interleaved rounds, the wall time of ``chromium --headless --dump-dom`` (start, parse, run the
page's scripts, reach the load event) and the page's own load time (the navigation's
load event, from the start of navigation, read back through the DOM).

    python benchmarks/report_load.py before.html after.html [--rounds 3]

The figure issue 52 sets (at most 2 s for the r50 report) is the wall time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.browser import FLAGS, chromium

#: Appended to a copy of the page: the load event's time, where --dump-dom can read it.
PROBE = """<script>window.addEventListener('load', () => {
  const pre = document.createElement('pre'); pre.id = 'xsp-load';
  pre.textContent = String(Math.round(performance.now())); document.body.appendChild(pre);
});</script>"""


def probed(page: Path, into: Path) -> Path:
    copy = into / page.name
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"))
    return copy


def open_once(page: Path) -> tuple[float, float]:
    """(wall s, the page's loadEventEnd in s) of one headless Chromium opening ``page``."""
    with tempfile.TemporaryDirectory() as profile:
        began = time.perf_counter()
        done = subprocess.run(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1280,800",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )
        wall = time.perf_counter() - began
    found = re.search(rb'<pre id="xsp-load">(\d+)</pre>', done.stdout)
    return wall, (int(found.group(1)) / 1e3 if found else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for index, page in enumerate(args.pages):
            folder = Path(tmp) / str(index)
            folder.mkdir()
            copies.append(probed(page, folder))
        times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(copies))}
        for _ in range(args.rounds):
            for index, copy in enumerate(copies):  # interleaved: drift hits every page alike
                times[index].append(open_once(copy))
    for index, page in enumerate(args.pages):
        walls = ", ".join(f"{w:.2f}" for w, _ in times[index])
        loads = ", ".join(f"{load:.2f}" for _, load in times[index])
        median = statistics.median(w for w, _ in times[index])
        size = page.stat().st_size / 1e6
        print(f"{page} ({size:.1f} MB): wall {walls} s (median {median:.2f}); load event {loads} s")


if __name__ == "__main__":
    main()
