"""Open a game-day report in a real headless browser and check what it rendered.

    python -m chaos.gameday.browser_check gameday-report/index.html [--browser chromium]

The browser loads the file with the network off (a proxy that goes nowhere), dumps
the DOM it built, and takes a screenshot. The check passes when the DOM has the
report's sections, an SVG timeline per phase, an FMEA row for every row of the
table, every internal link lands on an element the browser created, every link to
the kept evidence (a relative path: ledger, receipt, stub logs) names a file or
folder beside the report, and nothing refers outside the page and its folder.
With --screenshot FILE the screenshot is kept there, for a person to look at. Exit 0 pass, 1 a check failed, 2 no browser or no report.
"""

from __future__ import annotations

import argparse
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
    for line in found:
        print(f"browser check: {line}")
    if found:
        return 1
    print(
        f"browser check: ok: {dom.phases} phases, {dom.svgs} timelines, {dom.fmea_rows} FMEA rows, "
        f"{len(dom.hrefs)} internal links all resolve, {len(dom.local)} evidence links name "
        f"files beside the report, screenshot {shot_bytes} bytes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
