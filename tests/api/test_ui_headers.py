"""Every dashboard answer carries its Content-Security-Policy (scripts and styles from the
platform only, no framing), nosniff and a same-origin Referrer-Policy; the templates hold
no inline script or style the policy would block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api.test_ui import key_of, sign_in

TEMPLATES = Path(__file__).resolve().parents[2] / "service" / "ui" / "templates"


def directives(policy: str) -> dict[str, str]:
    return {
        name: value.strip()
        for name, _, value in (part.strip().partition(" ") for part in policy.split(";"))
    }


@pytest.mark.parametrize(
    "path",
    [
        "/ui",
        "/ui/",
        "/ui/sign-in",
        "/ui/trainings",
        "/ui/keys",
        "/ui/static/dashboard.js",
        "/ui/static/dashboard.css",
        "/ui/static/no-such-file.js",
        "/ui/vendor/uPlot.iife.min.js",
    ],
)
def test_every_dashboard_answer_has_the_headers(
    client: TestClient, tenant: dict[str, str], path: str
) -> None:
    cookie = sign_in(client, key_of(tenant))
    client.cookies.set("dlaas_session", cookie["dlaas_session"].value)
    r = client.get(path, follow_redirects=False)
    policy = directives(r.headers["Content-Security-Policy"])
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["default-src"] == "'self'"
    assert "unsafe" not in r.headers["Content-Security-Policy"]
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "same-origin"


def test_the_api_answers_are_left_as_they_were(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.get("/v1/trainings", headers=tenant)
    assert r.status_code == 200
    assert "Content-Security-Policy" not in r.headers


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.html")))
def test_templates_have_no_inline_script_or_style(template: str) -> None:
    text = (TEMPLATES / template).read_text()
    inline_scripts = [t for t in re.findall(r"<script\b[^>]*>", text) if "src=" not in t]
    assert not inline_scripts
    assert not re.search(r"<style\b", text)
    assert not re.search(r"\sstyle\s*=", text)
    assert not re.search(r"\son[a-z]+\s*=", text)  # inline event handlers are scripts too
