"""Open a page in headless Chromium with the network off; report what a person would see go wrong.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ending in NUL on file descriptors 3 and 4), so nothing but the standard library is needed and no
port is opened. The check collects console errors, uncaught exceptions, log errors (failed
loads, CSP violations), every request that is not file: or data:, every failed request, and the
rendered size of every figure (each <svg>/<img> inside a <figure>, and any <img> elsewhere).

    check = check_page(Path("report/index.html"), screenshot=Path("shot.png"))
    check.problems()   # [] when the page is clean: no errors, no requests out, figures drawn

Chromium: Debian's `chromium` package (scripts/setup.sh --browser), or $GEMBENCH_CHROMIUM.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Sizes of every figure as the layout engine drew them; getBBox() is the extent of what the SVG
# actually contains, so an <svg> that parsed to nothing has an empty box even if CSS sizes it.
FIGURES_JS = """JSON.stringify(Array.from(document.querySelectorAll('figure svg, figure img, img')).filter(
  (el) => !(el.tagName.toLowerCase() === 'svg' && el.parentElement.closest('svg'))).map((el, i) => {
  const r = el.getBoundingClientRect();
  let content = [r.width, r.height];
  if (el.tagName.toLowerCase() === 'svg') { try { const b = el.getBBox(); content = [b.width, b.height]; } catch (e) { content = [0, 0]; } }
  else { content = [el.complete ? el.naturalWidth : 0, el.complete ? el.naturalHeight : 0]; }
  return {index: i, tag: el.tagName.toLowerCase(), width: r.width, height: r.height,
          content_width: content[0], content_height: content[1],
          caption: (((el.closest('figure') || {querySelector: () => null}).querySelector('figcaption') || {textContent: ''})
          .textContent.trim().slice(0, 80) || el.getAttribute('src') || '')};
}))"""


LAUNCHER = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execvp(sys.argv[3], sys.argv[3:])"
)


def _above(fd: int, lowest: int) -> int:
    """``fd`` moved to a descriptor number >= ``lowest`` (the original is closed)."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
    os.close(fd)
    return moved


def find_chromium() -> str | None:
    if os.environ.get("GEMBENCH_CHROMIUM"):
        return os.environ["GEMBENCH_CHROMIUM"]
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageCheck:
    url: str
    console_errors: list[str] = field(default_factory=list)
    requests_out: list[str] = field(default_factory=list)  # anything not file: / data:
    failed_requests: list[str] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)
    page_size: tuple[float, float] = (0.0, 0.0)

    def empty_figures(self) -> list[dict]:
        return [f for f in self.figures if min(f["width"], f["height"], f["content_width"], f["content_height"]) <= 0]

    def problems(self, min_figures: int = 1) -> list[str]:
        out = [f"console error: {e}" for e in self.console_errors]
        out += [f"request left the page: {u}" for u in self.requests_out]
        out += [f"request failed: {u}" for u in self.failed_requests]
        out += [
            f"figure {f['index']} ({f['tag']}) rendered {f['width']:.0f}x{f['height']:.0f}, content "
            f"{f['content_width']:.0f}x{f['content_height']:.0f}: {f['caption']!r}"
            for f in self.empty_figures()
        ]
        if len(self.figures) < min_figures:
            out.append(f"{len(self.figures)} figures on the page, expected at least {min_figures}")
        return out


class DevTools:
    """A minimal synchronous DevTools client over Chromium's debugging pipe."""

    def __init__(self, chromium: str, profile: str, extra_args: list[str]):
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # above 4, so that placing them at 3 and 4 in the child cannot overwrite one with the other
        to_chrome_r, from_chrome_w = (_above(fd, 10) for fd in (to_chrome_r, from_chrome_w))
        args = [
            "--headless",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-extensions",
            "--disable-sync",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--hide-scrollbars",
            "--mute-audio",
            # network off at the source too: no proxy answers and no name resolves
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            # the pages are local files with the network off; Chromium's sandbox needs user
            # namespaces that CI containers (and root) often lack, so it is not used
            "--no-sandbox",
            *extra_args,
            "about:blank",
        ]
        # the child needs the pipe ends as fds 3 and 4 exactly; a tiny Python launcher puts them
        # there and execs Chromium (a POSIX shell cannot redirect descriptors above 9)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(to_chrome_r), str(from_chrome_w), chromium, *args],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict | None:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-800:] if self.proc.stderr else ""
                raise RuntimeError(f"chromium closed the debugging pipe: {err.strip()}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise TimeoutError(f"chromium did not answer {method} within {timeout:g} s")
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            reply = self._read(deadline)
            if reply is None:
                return False
            self.events.append(reply)
        return True

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (reply := self._read(deadline)) is not None:
            self.events.append(reply)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - closing a browser that is already gone is fine
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()


def _console_text(params: dict) -> str:
    parts = []
    for a in params.get("args", []):
        parts.append(str(a.get("value", a.get("description", a.get("type")))))
    return " ".join(parts)


def check_page(
    page: Path,
    screenshot: Path | None = None,
    width: int = 1280,
    height: int = 900,
    full_page: bool = True,
    max_height: int | None = None,
    scale: float = 1.0,
    timeout: float = 60,
    chromium: str | None = None,
) -> PageCheck:
    """Load ``page`` (a local file) offline, collect what went wrong, optionally save a PNG.

    The screenshot is the whole page (``full_page``) cut at ``max_height`` CSS pixels, at ``scale``.
    """
    chromium = chromium or find_chromium()
    if not chromium:
        raise FileNotFoundError("no Chromium found (install it: scripts/setup.sh --browser)")
    url = Path(page).resolve().as_uri()
    check = PageCheck(url)
    with tempfile.TemporaryDirectory(prefix="gembench-chromium-") as profile:
        dt = DevTools(chromium, profile, [f"--window-size={width},{height}"])
        try:
            target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                dt.call(f"{domain}.enable", session=session)
            dt.call(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
                session=session,
            )
            dt.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            dt.events.clear()
            dt.call("Page.navigate", {"url": url}, session=session)
            if not dt.wait_for("Page.loadEventFired", timeout):
                raise TimeoutError(f"{url} did not finish loading within {timeout:g} s")
            dt.drain(0.5)  # late console messages and failed loads
            figures = dt.call("Runtime.evaluate", {"expression": FIGURES_JS, "returnByValue": True}, session=session)
            check.figures = json.loads(figures["result"]["value"])
            metrics = dt.call("Page.getLayoutMetrics", session=session)
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            check.page_size = (size["width"], size["height"])
            if screenshot is not None:
                h = size["height"] if full_page else height
                if max_height:
                    h = min(h, max_height)
                shot = dt.call(
                    "Page.captureScreenshot",
                    {
                        "format": "png",
                        "captureBeyondViewport": True,
                        "clip": {"x": 0, "y": 0, "width": width, "height": h, "scale": scale},
                    },
                    session=session,
                    timeout=timeout,
                )
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            dt.drain(0.2)
        finally:
            dt.close()
    requests: dict[str, str] = {}
    for e in dt.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            check.console_errors.append(_console_text(params))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            check.console_errors.append((d.get("exception") or {}).get("description") or d.get("text", "exception"))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            check.console_errors.append(f"{entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            u = params.get("request", {}).get("url", "")
            requests[params.get("requestId")] = u
            if not (u.startswith("file:") or u.startswith("data:")):
                check.requests_out.append(u)
        elif method == "Network.loadingFailed":
            u = requests.get(params.get("requestId"), "?")
            check.failed_requests.append(f"{u} ({params.get('errorText')})")
    return check


def save_small_png(src: Path, dst: Path, colors: int = 128) -> int:
    """Re-encode a screenshot with a ``colors`` palette (pages are flat colours): a README-sized file."""
    from PIL import Image  # comes with matplotlib

    with Image.open(src) as im:
        im.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
    return Path(dst).stat().st_size


def main(argv: list[str] | None = None) -> int:
    """python -m gembench.harness.report.html.browser PAGE [--screenshot PNG]: exit 1 on any problem."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gembench.harness.report.html.browser", description=main.__doc__)
    parser.add_argument("page", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None, help="write a PNG of the page")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--max-height", type=int, default=None, help="cut the screenshot at this many CSS pixels")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--min-figures", type=int, default=1, help="fewer figures than this is a problem (0 for a table page)"
    )
    parser.add_argument("--colors", type=int, default=0, help="re-encode the PNG with this many colours (smaller file)")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"no page {args.page}", file=sys.stderr)
        return 2
    if not find_chromium():
        print(
            "no Chromium found: install it with scripts/setup.sh --browser (or set GEMBENCH_CHROMIUM)", file=sys.stderr
        )
        return 2
    raw = args.screenshot.with_suffix(".raw.png") if args.screenshot and args.colors else args.screenshot
    check = check_page(args.page, raw, width=args.width, max_height=args.max_height, scale=args.scale)
    if raw is not None and raw != args.screenshot:
        save_small_png(raw, args.screenshot, args.colors)
        raw.unlink()
    print(f"{check.url}: {len(check.figures)} figures, page {check.page_size[0]:.0f}x{check.page_size[1]:.0f} px")
    if args.screenshot:
        print(f"screenshot: {args.screenshot} ({args.screenshot.stat().st_size / 1024:.0f} KiB)")
    problems = check.problems(args.min_figures)
    for p in problems:
        print(f"problem: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
