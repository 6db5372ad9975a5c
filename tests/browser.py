"""Headless Chromium (Debian's package, installed by `make test`) for tests that look at a page
as a person would: the DOM after the page's scripts ran, or a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: Flags that keep Chromium off the network (this machine reaches none) and quiet.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium() -> str:
    """The browser's path; skips the test without one, except under CI, where it must run."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        reason = "needs headless Chromium: apt-get install chromium (make test does)"
        if os.environ.get("CI"):
            pytest.fail(reason + " (make test installs it)")
        pytest.skip(reason)
    return path


def _run(url: str, *extra: str, size: str = "1500,2000", budget_ms: int = 20000) -> bytes:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                f"--virtual-time-budget={budget_ms}",
                *extra,
                url,
            ],
            capture_output=True,
            timeout=180,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout


def dump_dom(url: str, size: str = "1500,2000", budget_ms: int = 20000) -> str:
    """The page's DOM once its scripts have run (virtual time lets them finish)."""
    return _run(url, "--dump-dom", size=size, budget_ms=budget_ms).decode()


def screenshot(url: str, path: Path, size: str = "1500,2000") -> Path:
    _run(url, f"--screenshot={path}", size=size)
    return path
