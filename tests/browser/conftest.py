"""A real `dlaas up` (API, monitor, worker, learners) and Debian's Chromium driven by
Playwright (never a downloaded browser: `make browser` installs /usr/bin/chromium)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, sync_playwright

from tests.e2e.test_up import Up, start_up

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# Screenshots of the pages, kept as the test run's artifacts (gitignored).
ARTIFACTS = ROOT / "test-artifacts" / "browser"
# The accessibility rules engine, from npm like the dashboard's libraries (make ui-assets).
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    running = start_up(tmp_path_factory.mktemp("dashboard") / "home")
    try:
        yield running
    finally:
        try:
            running.stop()
        finally:
            running.kill()


@pytest.fixture(scope="module")
def admin_key(up: Up) -> str:
    return (up.home / "admin_api_key").read_text().strip()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install -y chromium)")
    with sync_playwright() as p:
        # --no-sandbox: Chromium's own sandbox needs user namespaces a root CI job lacks.
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Session:
    """A browser context on the platform, recording every request its pages make and
    every console error they log."""

    context: BrowserContext
    page: Page
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    # Each captured page's accessibility violations, by the capture's name.
    accessibility: dict[str, list[str]] = field(default_factory=dict)

    def capture(self, name: str) -> None:
        """A screenshot of the page and its accessibility check."""
        self.screenshot(name)
        self.accessibility[name] = self.accessibility_violations()

    def accessibility_violations(self) -> list[str]:
        """What axe-core finds against WCAG 2 A and AA on the page as it is now (the
        script is the context's init script: no request leaves the page, and the
        dashboard's Content-Security-Policy, which refuses inline scripts, is not asked)."""
        found: list[dict[str, Any]] = self.page.evaluate(
            "async () => (await axe.run(document, {runOnly: ['wcag2a', 'wcag2aa']})).violations"
        )
        return [
            f"{v['id']} ({v['impact']}): {v['help']} at "
            + ", ".join(str(n["target"]) for n in v["nodes"])
            for v in found
        ]

    def csp_violations(self) -> list[str]:
        """The Content-Security-Policy violations the page has reported so far."""
        found: list[str] = self.page.evaluate("() => window.__cspViolations || []")
        return found

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def session(browser: Browser, up: Up) -> Iterator[Session]:
    context = browser.new_context(
        base_url=up.url, viewport={"width": 1366, "height": 850}, accept_downloads=True
    )
    context.set_default_timeout(20_000)
    context.add_init_script(path=str(AXE))
    # Every Content-Security-Policy violation a page reports, as "directive blocked-uri".
    context.add_init_script(
        "document.addEventListener('securitypolicyviolation', (e) => {"
        " (window.__cspViolations = window.__cspViolations || [])"
        ".push(`${e.violatedDirective} ${e.blockedURI}`); });"
    )
    page = context.new_page()
    s = Session(context, page)
    context.on("request", lambda request: s.requests.append(request.url))

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            s.console_errors.append(f"{message.text} ({message.location.get('url')})")

    page.on("console", console)
    page.on("pageerror", lambda error: s.console_errors.append(f"page error: {error}"))
    try:
        yield s
    finally:
        context.close()


def sign_in(page: Page, key: str) -> None:
    page.goto("/ui/sign-in")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
