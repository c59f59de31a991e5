"""A real headless chromium for the node page's tests: Debian's chromium and chromedriver, driven by selenium.

Selenium is handed both paths, so it never looks for (or downloads) a driver. Each document gets a recorder
before any of its own scripts run: Content-Security-Policy violations, uncaught errors and unhandled promise
rejections land in ``window.__gpumonProblems``, which ``problems`` reads with the browser's console errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from support.helpers import require_module, require_tool
from support.poll import poll

INSTALL = "apt-get install chromium chromium-driver; pip install selenium"
RECORDER = """
window.__gpumonProblems = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__gpumonProblems.push("CSP " + e.violatedDirective + " blocked " + (e.blockedURI || "inline")));
window.addEventListener("error", (e) => window.__gpumonProblems.push("uncaught: " + e.message));
window.addEventListener("unhandledrejection", (e) => window.__gpumonProblems.push("unhandled: " + e.reason));
"""


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Any]:
    """A headless chromium whose viewport is ``width`` by ``height`` CSS pixels."""
    browser = require_tool("chromium", INSTALL)
    driver_path = require_tool("chromedriver", INSTALL)
    webdriver = require_module("selenium.webdriver")
    service = require_module("selenium.webdriver.chrome.service")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    # --no-sandbox: CI runs as root in a container, where chromium's sandbox cannot start
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=service.Service(driver_path))
    try:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORDER})
        yield driver
    finally:
        driver.quit()


def problems(driver: Any, allow_network: bool = False) -> list[str]:
    """What went wrong in the page since the last call: console errors, CSP violations, uncaught errors.
    ``allow_network``: leave out the console's lines for HTTP errors and refused connections, which a test
    of the error states causes on purpose (a page cannot keep the browser from logging them)."""
    found = [
        f"console ({e['source']}): {e['message']}"
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and not (allow_network and e["source"] == "network")
    ]
    recorded = driver.execute_script(
        "return window.__gpumonProblems ? window.__gpumonProblems.splice(0) : ['the recorder did not run']"
    )
    return found + list(recorded)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``check``'s first truthy value (support.poll.poll); an exception of check's counts as "not yet": a row
    redrawn under our feet (stale element) is looked at again."""
    return poll(check, timeout, what, every=0.1, retry=(Exception,))


def texts(driver: Any, css: str) -> list[str]:
    """The visible text of every element matching ``css``, read in one call (rows are redrawn often)."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), (e) => e.innerText)", css
        )
    )


def status(driver: Any) -> str:
    """The page's status line."""
    return str(driver.find_element("id", "status").text)


def refreshes(driver: Any) -> int:
    """How many refreshes the page has finished (its script counts them in ``data-refreshes``)."""
    return int(driver.execute_script("return Number(document.body.dataset.refreshes || 0)"))
