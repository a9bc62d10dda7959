"""A report page as a person sees it: loaded in a real headless Chromium (Debian's, driven by
Selenium through its ChromeDriver), not parsed as text.

`Makefile` installs `chromium` and `chromium-driver` with apt where it can (`make setup-dev`);
a machine without them skips the browser tests with that reason. Chromium is started as this
machine's closed network needs (no background networking, no component updates) with a fresh
profile, and every message the page logs is kept: a script error is a SEVERE entry.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@dataclass
class Page:
    """What the browser made of a page."""

    title: str
    headings: list[str]
    images: list[dict]  # alt, complete, naturalWidth, naturalHeight
    links: list[dict]  # text, href
    errors: list[str]  # SEVERE console entries: script errors, resources that failed
    text: str


def browser_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def load_page(path: Path) -> Page:
    """Open `path` in headless Chromium and read it back once it has loaded."""
    if not browser_available():
        pytest.skip("no headless Chromium here (make setup-dev installs chromium with apt)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="tg-chromium-")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(path.resolve().as_uri())
        # Every image decoded (or failed) before it is read: `complete` is true either way.
        driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "Promise.all([...document.images].map(i => i.decode().catch(() => null)))"
            ".then(() => done(true));"
        )
        page = Page(
            title=driver.title,
            headings=driver.execute_script(
                "return [...document.querySelectorAll('h1,h2,h3')].map(h => h.textContent)"
            ),
            images=driver.execute_script(
                "return [...document.images].map(i => ({alt: i.alt, complete: i.complete,"
                " naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight}))"
            ),
            links=driver.execute_script(
                "return [...document.links].map(a => ({text: a.textContent,"
                " href: a.getAttribute('href')}))"
            ),
            errors=[e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"],
            text=driver.execute_script("return document.body.innerText"),
        )
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return page
