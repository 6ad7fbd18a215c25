"""The dashboard under its Content-Security-Policy in a real browser: every page still
works (its scripts run, the keys page lists keys, the charts' library loads), no page
reports a policy violation or logs one, and every /ui/ answer carries the policy,
nosniff and the Referrer-Policy."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Response, expect

from service.ui.headers import HEADERS
from tests.browser.conftest import Session, sign_in
from tests.e2e.test_up import Up

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def test_every_page_works_under_the_policy(session: Session, up: Up, admin_key: str) -> None:
    page = session.page
    answers: list[Response] = []
    session.context.on("response", lambda response: answers.append(response))

    sign_in(page, admin_key)
    expect(page).to_have_url(re.compile(r"/ui/tenants$"))
    page.get_by_label("Name").fill("carol")
    page.get_by_label("Plan").fill("standard")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.locator("#new-key")).to_be_visible()
    key = page.locator("#new-key-value").inner_text().strip()
    page.get_by_role("button", name="Keys of carol").click()
    expect(page.locator("#keys tbody tr")).to_have_count(1)
    assert session.csp_violations() == []
    page.get_by_role("button", name="Sign out").click()

    sign_in(page, key)
    expect(page).to_have_url(re.compile(r"/ui/trainings$"))
    expect(page.locator("main h1")).to_be_visible()
    assert session.csp_violations() == []
    for path in ("/ui/trainings/new", "/ui/deployments", "/ui/keys"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        assert session.csp_violations() == [], path
    # The keys page's script (a file now, not inline) lists the tenant's key.
    expect(page.locator("#keys tbody tr")).to_have_count(1)
    # A training page loads the chart library and its script (the training is unknown).
    page.goto("/ui/trainings/no-such-training")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("() => typeof uPlot") == "function"
    assert session.csp_violations() == []

    dashboard = [a for a in answers if a.url.startswith(f"{up.url}/ui")]
    assert any(a.url.endswith(".js") for a in dashboard)
    assert any(a.url.endswith(".css") for a in dashboard)
    for answer in dashboard:
        headers = answer.all_headers()
        for name, value in HEADERS.items():
            assert headers.get(name.lower()) == value, (answer.url, name)
    # The browser logs the unknown training's 404 itself; nothing else is an error, and
    # Chromium logs every policy violation as one.
    not_found = "Failed to load resource: the server responded with a status of 404"
    errors = [m for m in session.console_errors if not m.startswith(not_found)]
    assert errors == [], errors
    assert not any("Content Security Policy" in m for m in session.console_errors)


def test_a_page_of_another_site_cannot_frame_the_dashboard(session: Session, up: Up) -> None:
    r = httpx.get(f"{up.url}/ui/sign-in")
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    page = session.page
    page.set_content(f'<iframe id="f" src="{up.url}/ui/sign-in"></iframe>')
    page.wait_for_timeout(1000)
    frame = page.frame_locator("#f")
    expect(frame.get_by_label("API key")).to_have_count(0)
