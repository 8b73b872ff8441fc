"""Open a page in headless Chromium with the network off; report what a person would see go wrong.

Selenium drives Debian's Chromium through Debian's chromedriver, both found on PATH (or named by
$GEMBENCH_CHROMIUM and $GEMBENCH_CHROMEDRIVER); the driver's path is given to Selenium, so
Selenium Manager never runs and nothing is downloaded. The check collects console errors, uncaught
exceptions and log errors (failed loads, CSP violations) from the browser log, every request that
is not file: or data: and every failed request from the performance log (the DevTools Network
events), and the rendered size of every figure (each <svg>/<img> inside a <figure>, and any <img>
elsewhere).

    check = check_page(Path("report/index.html"), screenshot=Path("shot.png"))
    check.problems()   # [] when the page is clean: no errors, no requests out, figures drawn

Chromium, chromium-driver and selenium: scripts/setup.sh --browser and the `test` extra.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# network off at the source too: no proxy answers and no name resolves; Chromium's sandbox needs
# user namespaces that CI containers (and root) often lack, and the pages are local files, so it
# is not used
FLAGS = (
    "--headless",
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
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--no-sandbox",
)

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


def _which(env: str, names: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    return next((p for p in map(shutil.which, names) if p), None)


def find_chromium() -> str | None:
    return _which("GEMBENCH_CHROMIUM", CHROMIUMS)


def find_chromedriver() -> str | None:
    return _which("GEMBENCH_CHROMEDRIVER", ("chromedriver",))


def missing() -> str | None:
    """One line naming what the check lacks (Chromium, its driver, selenium), or None."""
    if find_chromium() is None:
        return "Chromium not installed: `scripts/setup.sh --browser` (or set GEMBENCH_CHROMIUM)"
    if find_chromedriver() is None:
        return "chromedriver not installed: `scripts/setup.sh --browser` (or set GEMBENCH_CHROMEDRIVER)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed: pip install -e '.[test]'"
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
    chromedriver: str | None = None,
) -> PageCheck:
    """Load ``page`` (a local file) offline, collect what went wrong, optionally save a PNG.

    The screenshot is the whole page (``full_page``) cut at ``max_height`` CSS pixels, at ``scale``.
    """
    chromium = chromium or find_chromium()
    chromedriver = chromedriver or find_chromedriver()
    if not chromium or not chromedriver:
        raise FileNotFoundError(missing() or "no Chromium or chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    url = Path(page).resolve().as_uri()
    check = PageCheck(url)
    with tempfile.TemporaryDirectory(prefix="gembench-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        driver = webdriver.Chrome(options, Service(chromedriver, log_output=subprocess.DEVNULL))
        try:
            driver.set_page_load_timeout(timeout)
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            )
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            for log in ("browser", "performance"):  # start both logs at the page
                driver.get_log(log)
            driver.get(url)  # returns once the load event has fired
            time.sleep(0.5)  # late console messages and failed loads
            check.figures = json.loads(driver.execute_script("return " + FIGURES_JS))
            metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            check.page_size = (size["width"], size["height"])
            if screenshot is not None:
                h = size["height"] if full_page else height
                if max_height:
                    h = min(h, max_height)
                shot = driver.execute_cdp_cmd(
                    "Page.captureScreenshot",
                    {
                        "format": "png",
                        "captureBeyondViewport": True,
                        "clip": {"x": 0, "y": 0, "width": width, "height": h, "scale": scale},
                    },
                )
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            time.sleep(0.2)
            browser_log, performance_log = driver.get_log("browser"), driver.get_log("performance")
        finally:
            driver.quit()
    # console.error/assert, uncaught exceptions and Log errors all arrive as SEVERE
    check.console_errors = [e["message"] for e in browser_log if e.get("level") == "SEVERE"]
    requests: dict[str, str] = {}
    for entry in performance_log:
        event = json.loads(entry["message"])["message"]
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            u = params.get("request", {}).get("url", "")
            requests[params.get("requestId")] = u
            if not (u.startswith("file:") or u.startswith("data:")):
                check.requests_out.append(u)
        elif method == "Network.loadingFailed":
            u = requests.get(params.get("requestId"), "?")
            check.failed_requests.append(f"{u} ({params.get('errorText')})")
    return check
