#!/usr/bin/env python3
"""Check a Snakemake HTML report (``snakemake --report reports/report.html``) in a real
headless browser (Debian's ``chromium``) and optionally save a screenshot.

    python tools/check_report.py reports/report.html [--screenshot docs/report.png] [--show table1]

What is checked, each in chromium with ``--dump-dom`` after a virtual-time budget:

1. the report's React app renders: the navigation lists every result category, and when a
   category is opened (``app.showCategory``, what clicking it does) every result of it is
   listed; a result's info panel shows its caption;
2. every embedded HTML table (``text/html`` result) renders to table cells, and when the
   table's CSV sits beside it (``reports/<name>.csv``) the cells are the CSV's;
3. every embedded PNG (``image/png`` result) is a PNG whose decoded size in the browser
   (``naturalWidth`` x ``naturalHeight``) is the size its header states.

With ``--screenshot`` the report is opened on one table (``--show``: a substring of its path,
default the first HTML result) the way its "view" button does, and captured as a PNG.
Exit status 0 when every check passes, 1 otherwise (with the reasons), 2 when no chromium.
The browser runs offline (no network access is needed: the report embeds everything).
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHECK_ID = "fedlib-check"


def find_browser(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if shutil.which(explicit) or Path(explicit).is_file() else None
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


SHOT_SIZE = (1440, 900)


def _crop(png: Path, size: tuple[int, int]) -> None:
    """Crop a screenshot to ``size`` (needs Pillow, which matplotlib brings; left as is without it)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as image:
        if image.size != size:
            image.crop((0, 0, min(size[0], image.size[0]), min(size[1], image.size[1]))).save(png)


def run_browser(browser: str, page: Path, mode: str, out: Path | None = None, budget_ms: int = 15000,
                size: tuple[int, int] = SHOT_SIZE, timeout: int = 180) -> str:
    """--dump-dom (returns the DOM) or --screenshot=out of a local page, headless and offline."""
    with tempfile.TemporaryDirectory(prefix="fedlib-chromium-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
               f"--window-size={size[0]},{size[1]}", "--hide-scrollbars"]
        cmd += ["--dump-dom"] if mode == "dom" else [f"--screenshot={out}"]
        cmd.append(page.resolve().as_uri())
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{browser} failed on {page} ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def embedded_json(report_html: str, script_id: str):
    """The JSON a Snakemake report embeds as ``<script id="...">var x = {...};</script>``."""
    match = re.search(rf'<script id="{script_id}">\s*var \w+ = (.*?);\s*</script>', report_html, re.S)
    if not match:
        raise ValueError(f"no <script id=\"{script_id}\"> in the report: not a Snakemake HTML report?")
    return json.loads(match.group(1))


def decode_data_uri(uri: str) -> bytes:
    head, _, payload = uri.partition(",")
    return base64.b64decode(payload) if head.endswith(";base64") else payload.encode()


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def table_cells(dom: str) -> list[list[str]]:
    rows = []
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", dom, re.S):
        cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
        rows.append([html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
    return rows


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


# Runs inside the report: open each category and one result's info panel the way clicking
# them does, note what the navigation shows, then leave the chosen result on screen.
PROBE = """
<script>
window.addEventListener("load", function () {
  var out = {categories: {}, info: null, shown: null, viewport: [window.innerWidth, window.innerHeight]};
  var cats = Object.keys(categories);
  var show = %(show)s;
  function nav() { var n = document.querySelector("nav"); return n ? n.innerText : ""; }
  function later(f, ms) { setTimeout(f, ms || 400); }
  // back to the menu first, as a reader does (the result list is built when it mounts)
  function open(cat, then) { app.setView({navbarMode: "menu"}); later(function () { app.showCategory(cat); later(then); }); }
  function step(i) {
    if (i < cats.length) {
      open(cats[i], function () { out.categories[cats[i]] = nav(); step(i + 1); });
    } else if (show) {
      var cat = cats.find(function (c) {
        return Object.values(categories[c]).some(function (l) { return l.indexOf(show) >= 0; }); });
      open(cat, function () {
        var mime = results[show].mime_type;  // what the result's "view" (eye) button does:
        app.setView({content: mime === "text/html" ? "html" : "img",
                     contentPath: results[show].data_uri, resultPath: show});
        later(function () {
          app.showResultInfo(show);  // what its "info" button does: the caption in the side bar
          later(function () { out.info = nav(); out.shown = show; finish(); }, 1000);
        });
      });
    } else { finish(); }
  }
  function finish() {
    var pre = document.createElement("pre");
    pre.id = "%(check_id)s"; pre.style.display = "none";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  later(function () { step(0); }, 500);
});
</script>
"""


def probe_page(report_html: str, show: str | None, folder: Path) -> Path:
    script = PROBE % {"show": json.dumps(show), "check_id": CHECK_ID}
    page = folder / "report-probe.html"
    end = report_html.rfind("</body>")  # the last one: bundled scripts contain "</body>" in strings
    page.write_text(report_html[:end] + script + report_html[end:] if end >= 0 else report_html + script,
                    encoding="utf-8")
    return page


def check_report(report: Path, browser: str, workdir: Path, screenshot: Path | None = None,
                 show: str | None = None, expect_categories=()) -> list[str]:
    """Run every check; return the problems found (empty = all good). Prints what was checked."""
    problems: list[str] = []
    text = report.read_text(encoding="utf-8")
    results = embedded_json(text, "results")
    categories = embedded_json(text, "categories")
    if not results:
        return [f"{report}: the report holds no results"]
    for name in expect_categories:
        if name not in categories:
            problems.append(f"category {name!r} missing (report has {sorted(categories)})")
    html_results = [p for p, r in results.items() if r["mime_type"] == "text/html"]
    png_results = [p for p, r in results.items() if r["mime_type"] == "image/png"]
    if show is not None:
        matches = [p for p in results if show in p]
        if not matches:
            return problems + [f"--show {show!r} matches no result ({sorted(results)})"]
        show = matches[0]
    elif html_results:
        show = html_results[0]

    with tempfile.TemporaryDirectory(prefix="fedlib-report-check-") as tmp:
        folder = Path(tmp)
        # 1. the app renders; categories list their results; the info panel has the caption
        page = probe_page(text, show, folder)
        dom = run_browser(browser, page, "dom")
        match = re.search(rf'<pre id="{CHECK_ID}"[^>]*>(.*?)</pre>', dom, re.S)
        if not match:
            problems.append("the report's app did not render (no probe output in the DOM)")
        else:
            probe = json.loads(html.unescape(match.group(1)))
            for cat, subcats in categories.items():
                listed = probe["categories"].get(cat, "")
                for paths in subcats.values():
                    for path in paths:
                        if results[path]["name"] not in listed:
                            problems.append(f"category {cat!r} does not list {results[path]['name']}")
            caption = re.sub(r"\s+", "", _text(results[show]["caption"])) if show else ""
            if show and caption and caption[:60] not in re.sub(r"\s+", "", probe.get("info") or ""):
                problems.append(f"the info panel of {show} does not show its caption")
            viewport = probe.get("viewport") or SHOT_SIZE
            print(f"app: {len(categories)} categories ({', '.join(categories)}), {len(results)} results listed")

        # 2. tables render to the CSV's cells
        for path in html_results:
            page = folder / "table.html"
            page.write_bytes(decode_data_uri(results[path]["data_uri"]))
            rows = table_cells(run_browser(browser, page, "dom", budget_ms=2000))
            if len(rows) < 2 or not any(re.match(r"^-?\d", c) for row in rows[1:] for c in row):
                problems.append(f"{path}: no table with numbers rendered")
                continue
            sibling = (workdir / path).with_suffix(".csv")
            if sibling.is_file():
                # HTML collapses runs of whitespace, so cells compare modulo whitespace
                expected = [[" ".join(c.split()) for c in row] for row in csv.reader(sibling.open(encoding="utf-8"))]
                if [[" ".join(c.split()) for c in row] for row in rows] != expected:
                    problems.append(f"{path}: rendered cells differ from {sibling}")
            print(f"table {path}: {len(rows) - 1} rows x {len(rows[0])} columns rendered"
                  + (" (= its CSV)" if sibling.is_file() else ""))

        # 3. images decode in the browser at their stated size
        for path in png_results:
            data = decode_data_uri(results[path]["data_uri"])
            try:
                width, height = png_size(data)
            except ValueError as err:
                problems.append(f"{path}: {err}")
                continue
            page = folder / "image.html"
            page.write_text(
                f'<!doctype html><html><body><img id="i" src="{results[path]["data_uri"]}">'
                '<script>window.onload=function(){var i=document.getElementById("i");'
                'document.body.setAttribute("data-size", i.naturalWidth + "x" + i.naturalHeight);};</script>'
                "</body></html>", encoding="utf-8")
            dom = run_browser(browser, page, "dom", budget_ms=2000)
            size = re.search(r'data-size="(\d+)x(\d+)"', dom)
            if not size or (int(size.group(1)), int(size.group(2))) != (width, height):
                problems.append(f"{path}: the browser decoded {size.group(0) if size else 'nothing'}, "
                                f"the PNG header says {width}x{height}")
            else:
                print(f"image {path}: {width}x{height} PNG decoded by the browser")

        # the screenshot: the probe page ends on the chosen result, as its view button shows it
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            # headless chromium's viewport is shorter than --window-size (room for a browser UI
            # it does not draw): ask for that much more and crop it off
            extra = max(0, SHOT_SIZE[1] - int(viewport[1])) if match else 0
            run_browser(browser, probe_page(text, show, folder), "shot", out=screenshot.resolve(),
                        size=(SHOT_SIZE[0], SHOT_SIZE[1] + extra))
            _crop(screenshot, SHOT_SIZE)
            try:
                width, height = png_size(screenshot.read_bytes())
                print(f"screenshot {screenshot}: {width}x{height}, showing {show}")
            except (OSError, ValueError) as err:
                problems.append(f"screenshot {screenshot}: {err}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the HTML report (snakemake --report reports/report.html)")
    parser.add_argument("--screenshot", type=Path, help="save a PNG screenshot of the report showing one table")
    parser.add_argument("--show", help="result to show in the screenshot (a substring of its path)")
    parser.add_argument("--workdir", type=Path, default=Path.cwd(),
                        help="the workflow's working directory (result paths are relative to it)")
    parser.add_argument("--expect-category", action="append", default=[], help="a category that must exist")
    parser.add_argument("--chromium", help="browser executable (default: chromium on PATH)")
    args = parser.parse_args(argv)
    browser = find_browser(args.chromium)
    if browser is None:
        print("no chromium found: install it (Debian: apt-get install chromium) or pass --chromium", file=sys.stderr)
        return 2
    problems = check_report(args.report, browser, args.workdir, args.screenshot, args.show, args.expect_category)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print("report OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
