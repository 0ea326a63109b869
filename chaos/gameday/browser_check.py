"""Open a game-day report in a real headless browser and check what it rendered.

    python -m chaos.gameday.browser_check gameday-report/index.html [--browser chromium]

The browser loads the file with the network off (a proxy that goes nowhere), dumps
the DOM it built, and takes a screenshot. The check passes when the DOM has the
report's sections, an SVG timeline per phase, an FMEA row for every row of the
table, every internal link lands on an element the browser created, every link to
the kept evidence (a relative path: ledger, receipt, stub logs) names a file or
folder beside the report, nothing refers outside the page and its folder, and, in
a window 1366 px wide with every phase opened, no table cell reaches past the
window's right edge (a long expected value must wrap, not push the observed and
verdict columns off the screen).
With --screenshot FILE the screenshot is kept there, for a person to look at. Exit 0 pass, 1 a check failed, 2 no browser or no report.
"""

from __future__ import annotations

import argparse
import html as html_lib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

TIMEOUT_S = 60
FLAGS = [
    "--headless",
    "--no-sandbox",  # as root in a container chromium refuses to start otherwise
    "--disable-gpu",
    "--proxy-server=127.0.0.1:9",  # nothing may be fetched: any attempt fails
    "--proxy-bypass-list=<-loopback>",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def is_local(href: str) -> bool:
    """A relative path (the kept evidence beside the report), not a URL or absolute path."""
    parts = urlsplit(href)
    return not (parts.scheme or parts.netloc or href.startswith("/"))


def missing_local(report: Path, hrefs: list[str]) -> list[str]:
    """The relative links that name nothing on disk, from the report's folder."""
    return sorted({h for h in hrefs if not (report.parent / unquote(h)).exists()})


class Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.local: list[str] = []
        self.external: list[str] = []
        self.svgs = 0
        self.phases = 0
        self.fmea_rows = 0

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if "id" in values:
            self.ids.add(values["id"])
            if values["id"].startswith("fmea-f"):
                self.fmea_rows += 1
        if tag == "svg":
            self.svgs += 1
        if tag == "article" and "phase" in (values.get("class") or "").split():
            self.phases += 1
        for key in ("href", "src", "xlink:href", "action"):
            value = values.get(key)
            if value is None:
                continue
            if value.startswith("#"):
                self.hrefs.append(value[1:])
            elif key == "href" and is_local(value):
                self.local.append(value)
            else:
                self.external.append(value)


LAYOUT_WIDTH = 1366  # a common laptop screen: the width a reader's window most often has
LAYOUT_HEIGHT = 900
LAYOUT_ID = "docket-layout"
# Run in a copy of the report: every <details> opened (a phase that passed is shut, and
# a shut table has no layout), then each cell whose right edge is past the viewport
# named, as JSON in an element --dump-dom carries out.
MEASURE = """<script>
(function () {
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  // the page's visible width: the window less its scrollbar
  var width = document.documentElement.clientWidth, out = [];
  document.querySelectorAll("td, th").forEach(function (cell) {
    var right = cell.getBoundingClientRect().right;
    if (right > width + 0.5) {
      var at = cell.closest("[id]");
      out.push({right: Math.round(right), at: at ? at.id : "",
                text: cell.textContent.trim().slice(0, 60)});
    }
  });
  var cells = document.querySelectorAll("td, th").length;
  var pre = document.createElement("pre");
  pre.id = "@ID@";
  pre.textContent = JSON.stringify({window: window.innerWidth, width: width, cells: cells,
                                    beyond: out});
  document.body.appendChild(pre);
})();
</script>""".replace("@ID@", LAYOUT_ID)


def browser_command(browser: str, profile: str) -> list[str]:
    return [browser, *FLAGS, f"--user-data-dir={profile}"]


def measure_layout(browser: str, report: Path, width: int = LAYOUT_WIDTH) -> dict:
    """{"window", "width", "cells", "beyond": [{"right", "at", "text"}]}: the report laid
    out in a window `width` px wide, and every table cell that reaches past its visible
    width (the window less the scrollbar). Raises
    RuntimeError when the browser did not lay the page out."""
    html = report.read_text(encoding="utf-8")
    if "</body>" not in html:
        raise RuntimeError(f"{report}: no </body> to measure before")
    with tempfile.TemporaryDirectory(prefix="docket-layout-") as tmp:
        copy = Path(tmp) / "measured.html"
        copy.write_text(html.replace("</body>", MEASURE + "</body>", 1), encoding="utf-8")
        profile = Path(tmp) / "profile"
        dumped = subprocess.run(
            [
                *browser_command(browser, str(profile)),
                f"--window-size={width},{LAYOUT_HEIGHT}",
                "--dump-dom",
                copy.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    found = re.search(rf'<pre id="{LAYOUT_ID}">(.*?)</pre>', dumped.stdout, re.S)
    if dumped.returncode != 0 or found is None:
        raise RuntimeError(f"{browser} did not lay out {report}: {dumped.stderr.strip()[-300:]}")
    return json.loads(html_lib.unescape(found.group(1)))


def layout_problems(measured: dict, width: int = LAYOUT_WIDTH) -> list[str]:
    if measured["window"] != width:
        return [f"the window was {measured['window']} px wide, not {width}: not measured"]
    if measured["cells"] == 0:
        return ["no table cell was laid out"]
    beyond = measured["beyond"]
    if not beyond:
        return []
    shown = "; ".join(f"#{b['at']} {b['text']!r} to {b['right']} px" for b in beyond[:5])
    return [
        f"{len(beyond)} table cell(s) reach past a {width} px window "
        f"({measured['width']} px within its scrollbar): {shown}"
    ]


def phase_screenshot(browser: str, report: Path, phase_id: str, target: Path) -> int:
    """A LAYOUT_WIDTH x LAYOUT_HEIGHT screenshot of one phase at the top of the window;
    its size in bytes (0: none). Taken of a copy in which the rest of the page is not
    displayed (the phase is laid out in the same body width): headless Chromium paints a
    page scrolled to an anchor only in part."""
    only = (
        "<style>body > header, body > section:not(#phases), #phases > p, "
        f'#phases > article:not([id="{phase_id}"]) {{ display: none; }}</style>'
    )
    html = report.read_text(encoding="utf-8").replace("</head>", only + "</head>", 1)
    with tempfile.TemporaryDirectory(prefix="docket-shot-") as tmp:
        copy, shot = Path(tmp) / "phase.html", Path(tmp) / "shot.png"
        copy.write_text(html, encoding="utf-8")
        subprocess.run(
            [
                *browser_command(browser, str(Path(tmp) / "profile")),
                f"--screenshot={shot}",
                f"--window-size={LAYOUT_WIDTH},{LAYOUT_HEIGHT}",
                copy.as_uri(),
            ],
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        if not shot.exists() or shot.stat().st_size == 0:
            return 0
        shutil.copyfile(shot, target)
        return shot.stat().st_size


def problems(dom: Dom) -> list[str]:
    out = []
    for section in ("summary", "phases", "fmea", "review"):
        if section not in dom.ids:
            out.append(f"no #{section} section in the rendered page")
    if dom.phases == 0:
        out.append("no phase was rendered")
    if dom.svgs < 1:
        out.append("no SVG timeline was rendered")
    if dom.fmea_rows == 0:
        out.append("no FMEA row was rendered")
    missing = sorted({h for h in dom.hrefs if h not in dom.ids})
    if missing:
        out.append(f"{len(missing)} internal link(s) without an anchor: {', '.join(missing[:10])}")
    if dom.external:
        out.append(f"refers outside the page: {', '.join(dom.external[:5])}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.gameday.browser_check")
    parser.add_argument("report")
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--screenshot", default=None, metavar="FILE", help="keep it here")
    parser.add_argument(
        "--wide-screenshot",
        default=None,
        metavar="FILE",
        help=f"keep a {LAYOUT_WIDTH}x{LAYOUT_HEIGHT} screenshot of the first phase that did "
        "not pass here (the phase alone at the top of the window)",
    )
    args = parser.parse_args(argv)
    report = Path(args.report).resolve()
    if not report.is_file():
        print(f"browser check: no report at {report}", file=sys.stderr)
        return 2
    if shutil.which(args.browser) is None:
        print(f"browser check: no browser {args.browser!r}", file=sys.stderr)
        return 2
    url = report.as_uri()
    with tempfile.TemporaryDirectory(prefix="docket-browser-") as profile:
        common = [args.browser, *FLAGS, f"--user-data-dir={profile}"]
        dumped = subprocess.run(
            [*common, "--dump-dom", url], capture_output=True, text=True, timeout=TIMEOUT_S
        )
        shot = Path(profile) / "report.png"
        subprocess.run(
            [*common, f"--screenshot={shot}", "--window-size=1200,2400", url],
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        shot_bytes = shot.stat().st_size if shot.exists() else 0
        if shot_bytes and args.screenshot:
            shutil.copyfile(shot, args.screenshot)
    if dumped.returncode != 0 or "<html" not in dumped.stdout:
        print(f"browser check: {args.browser} did not render {url}: {dumped.stderr.strip()[-300:]}")
        return 1
    dom = Dom()
    dom.feed(dumped.stdout)
    found = problems(dom)
    gone = missing_local(report, dom.local)
    if gone:
        found.append(f"{len(gone)} evidence link(s) name no file: {', '.join(gone[:5])}")
    if shot_bytes == 0:
        found.append("the browser took no screenshot (the page did not paint)")
    try:
        found += layout_problems(measure_layout(args.browser, report))
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
        found.append(f"the layout at {LAYOUT_WIDTH} px could not be measured: {exc}")
    if args.wide_screenshot:
        failing = re.search(r'<article class="phase (?:fail|unknown)" id="([^"]+)"', dumped.stdout)
        if failing is None:
            print(f"browser check: no phase failed: no {LAYOUT_WIDTH} px screenshot to take")
        elif not phase_screenshot(
            args.browser, report, failing.group(1), Path(args.wide_screenshot)
        ):
            found.append(f"no {LAYOUT_WIDTH}x{LAYOUT_HEIGHT} screenshot was taken")
    for line in found:
        print(f"browser check: {line}")
    if found:
        return 1
    print(
        f"browser check: ok: {dom.phases} phases, {dom.svgs} timelines, {dom.fmea_rows} FMEA rows, "
        f"{len(dom.hrefs)} internal links all resolve, {len(dom.local)} evidence links name "
        f"files beside the report, screenshot {shot_bytes} bytes, no table cell past a "
        f"{LAYOUT_WIDTH} px window"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
