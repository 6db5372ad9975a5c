"""How fast the Jaeger search link that ``xsp push`` prints opens: the UI's API query the link
makes (bytes, traces, seconds) and the page in headless Chromium (wall seconds until its DOM,
with the results drawn, is dumped, less the same for a search page that asks for nothing).

    make jaeger-up   # or any Jaeger with its UI
    xsp push runs/r50 --endpoint http://127.0.0.1:4318        # prints the link
    python benchmarks/jaeger_link.py 'http://127.0.0.1:16686/search?service=...' [LINK ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync")


def api_query(link: str) -> tuple[int, int, float]:
    """(bytes, traces, seconds) of the UI's ``/api/traces`` query for ``link``'s search."""
    url = urllib.parse.urlsplit(link)
    api = f"{url.scheme}://{url.netloc}/api/traces?{url.query}"
    began = time.perf_counter()
    with urllib.request.urlopen(api, timeout=300) as response:
        body = response.read()
    seconds = time.perf_counter() - began
    return len(body), len(re.findall(rb'"traceID":"[0-9a-f]+","spans"', body)), seconds


def page_seconds(link: str) -> tuple[float, int]:
    """(wall seconds, result items drawn) of the page in headless Chromium."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("needs chromium")
    with tempfile.TemporaryDirectory() as profile:
        began = time.perf_counter()
        done = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", "--window-size=1280,800",
             "--virtual-time-budget=60000", "--dump-dom", link],
            capture_output=True, timeout=600, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - began
    items = len(re.findall(rb'class="ResultItemTitle"', done.stdout))
    return seconds, items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("links", nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = urllib.parse.urlsplit(args.links[0])
    empty = f"{base.scheme}://{base.netloc}/search"  # the page, no search made
    blanks = [page_seconds(empty)[0] for _ in range(args.repeat)]
    blank = min(blanks)
    print(
        f"search page without a query: {blank:.2f} s in Chromium, least of {args.repeat} "
        f"(median {statistics.median(blanks):.2f} s; the least is subtracted below)"
    )
    for link in args.links:
        queries = [api_query(link) for _ in range(args.repeat)]
        size, traces, _ = queries[0]
        api = sorted(q[2] for q in queries)
        pages = [page_seconds(link) for _ in range(args.repeat)]
        page = sorted(p[0] - blank for p in pages)
        print(
            f"{link}\n  API: {size / 1e6:.1f} MB, {traces} traces, {api[0]:.2f} s least, "
            f"{statistics.median(api):.2f} s median of {args.repeat}; page: {page[0]:.2f} s "
            f"least, {statistics.median(page):.2f} s median more than the empty page; "
            f"{pages[0][1]} results drawn"
        )


if __name__ == "__main__":
    main()
