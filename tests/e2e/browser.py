"""A real browser for the console's tests: Debian's ``chromium``, driven headless through
``chromium-driver`` with Selenium. Nothing is downloaded: the browser and the driver are the
system's (``scripts/test`` installs the two packages), and Selenium's own driver manager is
told to stay offline.

The browser resolves no host name but 127.0.0.1, so a page that tried to load anything from
another origin would fail visibly (and its resource list, which the tests read, would say so).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Bound on any one thing appearing on a page; generous, CI shares two cores.
PATIENCE = 60.0
DESKTOP = (1280, 900)
PHONE = (390, 844)

T = TypeVar("T")


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (Path(path).exists() or shutil.which(Path(path).name)):
            return f"{path} is missing: install Debian's {package} package (scripts/test does)"
    return None


@contextmanager
def chromium(size: tuple[int, int] = DESKTOP, *, phone: bool = False) -> Iterator[webdriver.Chrome]:
    """A headless Chromium window of ``size`` CSS pixels (with a phone's touch and user agent
    when ``phone``), closed on exit."""
    problem = missing_browser()
    if problem:
        raise RuntimeError(problem)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never fetch a browser or a driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace to sandbox with
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--lang=en-US",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # Only the API's own host resolves: any other origin fails to load.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    if phone:
        options.add_experimental_option(
            "mobileEmulation",
            {
                "deviceMetrics": {"width": size[0], "height": size[1], "pixelRatio": 1.0},
                "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 "
                "(KHTML, like Gecko) Chrome/156.0 Mobile Safari/537.36",
            },
        )
    else:
        options.add_argument(f"--window-size={size[0]},{size[1]}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        if not phone:
            # --window-size sets the outer window; make the page itself `size`.
            inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
            driver.set_window_size(size[0] * 2 - inner[0], size[1] * 2 - inner[1])
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], T | None], what: str, timeout: float = PATIENCE) -> T:
    """Poll ``check`` until it returns something truthy (a stale element counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (StaleElementReferenceException, WebDriverException) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not seen within {timeout} s (last: {last!r})")
        time.sleep(0.1)


def text_of(driver: webdriver.Chrome, css: str) -> str:
    return "\n".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def wait_text(driver: webdriver.Chrome, css: str, text: str, timeout: float = PATIENCE) -> str:
    """Until an element matching ``css`` shows ``text``; the matched elements' text."""
    return wait_for(
        lambda: found if text in (found := text_of(driver, css)) else None,
        f"{text!r} in {css}",
        timeout,
    )


def element(driver: webdriver.Chrome, css: str) -> WebElement:
    return wait_for(
        lambda: next(iter(driver.find_elements(By.CSS_SELECTOR, css)), None), f"element {css}"
    )


def loaded_urls(driver: webdriver.Chrome) -> list[str]:
    """The page's own URL and every resource it loaded or fetched (scripts, modules, styles,
    images, API calls), from the browser's resource timing."""
    urls: list[str] = driver.execute_script(
        "return [document.URL, ...performance.getEntriesByType('resource').map(e => e.name)]"
    )
    return urls


def console_problems(driver: webdriver.Chrome) -> list[str]:
    """Browser console messages that mean something is wrong with the page itself: a refused
    load (Content-Security-Policy), a script error. An API answering 401/403/404/409 is logged
    by Chromium as a failed load; those are the API speaking and are left out."""
    problems = []
    for entry in driver.get_log("browser"):
        message = str(entry.get("message", ""))
        if entry.get("level") != "SEVERE" and "Content Security Policy" not in message:
            continue
        if "Failed to load resource" in message and any(
            f"status of {code}" in message for code in (401, 403, 404, 409)
        ):
            continue
        problems.append(message)
    return problems


def no_horizontal_scroll(driver: webdriver.Chrome) -> bool:
    """The page fits its viewport's width (tables may scroll inside their own box)."""
    return bool(
        driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1"
        )
    )


def screenshot(driver: webdriver.Chrome, path: Path) -> Path:
    """A PNG of the whole page (its full height, not just the viewport)."""
    width, height, full = driver.execute_script(
        "return [window.innerWidth, window.innerHeight, document.documentElement.scrollHeight]"
    )

    def metrics(h: int) -> None:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": h, "deviceScaleFactor": 1, "mobile": width < 700},
        )

    metrics(full)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
    finally:
        metrics(height)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5000, f"{path}: not a real screenshot"
    return path
