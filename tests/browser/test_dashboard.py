"""The dashboard in a real browser against a real `dlaas up`: the admin creates a tenant,
the tenant submits a 2-learner training from the page, watches its logs arrive live and
its status reach COMPLETED, reads its metrics chart, downloads a result, deploys it,
scores from the "try it" form and signs out; a wrong key and another tenant's training
are refused. Every request the pages make stays on the platform's origin."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Session, sign_in
from tests.e2e.test_up import Up
from tests.integration.platform_harness import EXAMPLES, zip_dir

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

TRAINING_TIMEOUT = 240_000  # ms; two TensorFlow learners on a busy 2-core machine


def status_of(page: Page) -> str:
    return page.locator("#status").inner_text().strip()


def test_the_whole_journey_in_the_dashboard(
    session: Session, up: Up, admin_key: str, tmp_path: Path
) -> None:
    page = session.page

    # `dlaas up` says where the dashboard is.
    (dashboard,) = re.findall(r"dashboard: +(\S+)", up.output)
    assert dashboard == f"{up.url}/ui/"

    # The admin creates a tenant from the tenants page; its key is shown once.
    page.goto(dashboard)
    expect(page).to_have_url(re.compile(r"/ui/sign-in$"))
    sign_in(page, admin_key)
    expect(page).to_have_url(re.compile(r"/ui/tenants$"))
    page.get_by_label("Name").fill("alice")
    page.get_by_label("Plan").fill("standard")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.locator("#new-key")).to_be_visible()
    key = page.locator("#new-key-value").inner_text().strip()
    assert key
    expect(page.locator("#tenants tr[data-tenant=alice]")).to_be_visible()
    session.capture("tenants")
    # Rotate it: issue another key, revoke the first (the page asks first).
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Keys of alice").click()
    keys = page.locator("#keys tbody tr")
    expect(keys).to_have_count(1)
    page.get_by_role("button", name="Issue a new key").click()
    expect(keys).to_have_count(2)
    expect(page.locator("#new-key-value")).not_to_have_text(key)
    first_key, key = key, page.locator("#new-key-value").inner_text().strip()
    keys.first.get_by_role("button", name=re.compile("^Revoke key")).click()
    expect(keys.first).to_contain_text("revoked")
    expect(keys.last).to_contain_text("valid")
    session.capture("tenant-keys")
    refused = httpx.get(f"{up.url}/v1/trainings", headers={"Authorization": f"Bearer {first_key}"})
    assert refused.status_code == 401
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/sign-in$"))

    # The tenant signs in: the key is in an HttpOnly cookie, nowhere a script can read.
    sign_in(page, key)
    expect(page).to_have_url(re.compile(r"/ui/trainings$"))
    stored = page.evaluate(
        "() => [document.cookie, JSON.stringify(localStorage), JSON.stringify(sessionStorage)]"
    )
    assert all(key not in value for value in stored), stored
    (cookie,) = [c for c in session.context.cookies() if c["name"] == "dlaas_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert key not in cookie["value"]

    # Submit from the page: a field the schema refuses shows its message next to it.
    page.get_by_role("link", name="Submit", exact=True).click()
    page.get_by_label("Name", exact=True).fill("mwms-ui")
    page.get_by_label("Framework", exact=True).fill("tensorflow")
    page.get_by_label("Version").fill("2.21")
    page.get_by_label("Parameter servers").fill("0")
    page.get_by_label("Command").fill("python3 train.py --steps 200 --log-every 10")
    page.get_by_label("Compute configuration").fill("P100")
    page.get_by_label("Nodes (learners)").fill("0")
    page.get_by_label("One per line").fill("loss: loss=([0-9.eE+-]+)")
    code = tmp_path / "mwms.zip"
    code.write_bytes(zip_dir(EXAMPLES / "mwms"))
    page.get_by_label("Code archive").set_input_files(str(code))
    extra = page.get_by_label("A JSON object merged into the manifest")
    extra.fill("{not json")
    page.get_by_role("button", name="Submit", exact=True).click()
    extra_error = page.locator('.field[data-field=""] .field-error')
    expect(extra_error).to_contain_text("not valid JSON")
    extra.fill('{"unknown_field": 1}')
    page.get_by_role("button", name="Submit", exact=True).click()
    nodes_error = page.locator('.field[data-field="/compute_configuration/nodes"] .field-error')
    expect(nodes_error).to_contain_text("greater than or equal to 1")
    expect(page.get_by_label("Nodes (learners)")).to_have_attribute("aria-invalid", "true")
    expect(extra_error).to_have_text("/unknown_field: is not a known manifest field")
    session.capture("submit-validation")
    extra.fill("{}")
    page.get_by_label("Nodes (learners)").fill("2")
    page.get_by_role("button", name="Submit", exact=True).click()
    expect(page.locator("#submitted")).to_be_visible()
    expect(page.locator("#upload-progress")).to_have_js_property("value", 100)
    expect(nodes_error).to_have_count(0)
    page.locator("#submitted-link").click()
    expect(page).to_have_url(re.compile(r"/ui/trainings/[^/]+$"))
    training_id = page.url.rsplit("/", 1)[1]

    # Both learners' lines arrive in the followed log while the training runs.
    log = page.locator("#log")
    expect(log).to_contain_text("[learner 1]", timeout=TRAINING_TIMEOUT)
    expect(log).to_contain_text("[learner 2]", timeout=TRAINING_TIMEOUT)
    live_status = status_of(page)
    assert live_status not in ("COMPLETED", "FAILED", "HALTED"), live_status
    session.capture("training-running")
    expect(page.locator("#status")).to_have_text(
        re.compile("COMPLETED|FAILED|HALTED"), timeout=TRAINING_TIMEOUT
    )
    assert status_of(page) == "COMPLETED", page.locator("#log").inner_text()[-3000:]
    expect(page.locator("#log-state")).to_contain_text("end of log")
    # The timeline is the status history; the learners ended with exit code 0.
    timeline = page.locator("#timeline li")
    expect(timeline.last).to_contain_text("COMPLETED")
    assert "QUEUED" in timeline.first.inner_text()
    expect(page.locator("#learners tbody tr")).to_have_count(2)
    for learner in (1, 2):
        row = page.locator(f"#learners tr[data-learner='{learner}']")
        expect(row).to_contain_text("COMPLETED")
        expect(row.locator("td").nth(2)).to_have_text("0")
    # Search narrows the shown lines; a learner's own log has only its lines.
    page.get_by_label("Search").fill("worker=1 step=")
    expect(log).not_to_contain_text("worker=0 step=")
    expect(log).to_contain_text("worker=1 step=")
    page.get_by_label("Search").fill("")
    page.get_by_label("Learner", exact=True).select_option("2")
    expect(log).to_contain_text("[learner 2]")
    expect(log).not_to_contain_text("[learner 1]")
    page.get_by_label("Learner", exact=True).select_option("")
    expect(log).to_contain_text("[learner 1]")

    # The metrics chart: one line per learner, its points those of GET .../metrics.
    api_metrics: dict[str, list[dict[str, Any]]] = page.request.get(
        f"/v1/trainings/{training_id}/metrics"
    ).json()
    assert api_metrics["loss"], api_metrics
    figure = page.locator("figure.metric[data-metric=loss]")
    expect(figure).to_have_attribute("data-learners", "2")
    expect(figure.locator(".u-legend")).to_contain_text("learner 1")
    expect(figure.locator(".u-legend")).to_contain_text("learner 2")
    expect(figure.locator("canvas")).to_have_count(1)
    rows = figure.locator("table.metric-data tbody tr")
    expect(rows).to_have_count(len(api_metrics["loss"]))
    shown = rows.evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.learner), r.dataset.step === '' ? null :"
        " Number(r.dataset.step), r.dataset.timestamp, Number(r.dataset.value)])"
    )
    expected = [[p["learner"], p["step"], p["timestamp"], p["value"]] for p in api_metrics["loss"]]
    assert shown == expected
    assert {p["learner"] for p in api_metrics["loss"]} == {1, 2}
    page.get_by_label("Against", exact=True).select_option("time")
    expect(figure.locator("figcaption")).to_have_text("loss against time")
    page.get_by_label("Against", exact=True).select_option("step")
    session.capture("training")

    # A result file downloads as stored.
    link = page.get_by_role("link", name="metrics.json")
    with page.expect_download() as download:
        link.click()
    downloaded = json.loads(Path(download.value.path()).read_text())
    assert downloaded["workers"] == 2
    with page.expect_download() as archive:
        page.get_by_role("link", name="Download all results (.tar.gz)").click()
    assert archive.value.suggested_filename.endswith("-results.tar.gz")

    # Deploy, then score from the "try it" form.
    page.get_by_role("button", name="Deploy").click()
    expect(page).to_have_url(re.compile(r"/ui/deployments/[^/]+$"))
    expect(page.locator("#status")).to_have_text(
        re.compile("READY|FAILED"), timeout=TRAINING_TIMEOUT
    )
    assert status_of(page) == "READY", page.locator("#status-message").inner_text()
    signature = page.locator("#signature tbody")
    expect(signature).to_contain_text("input")
    expect(signature.locator("tr").first).to_contain_text("x")
    expect(signature.locator("tr").first).to_contain_text("float32")
    expect(signature.locator("tr").first).to_contain_text("[any, 2]")
    expect(signature.locator("tr").last).to_contain_text("[any, 1]")
    page.get_by_label("Request body (JSON)").fill('{"instances": [[1.0, 0.0], [0.0, 1.0]]}')
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#try-latency")).to_contain_text(re.compile(r"Answered in [0-9.]+ ms"))
    answer = json.loads(page.locator("#try-answer").inner_text())
    predictions = answer["predictions"]
    assert len(predictions) == 2
    assert all(len(row) == 1 and isinstance(row[0], float) for row in predictions)
    session.capture("deployment")
    page.get_by_role("link", name="Deployments").click()
    expect(page.locator("#deployments tbody tr")).to_have_count(1)
    expect(page.locator("#deployments tbody")).to_contain_text("READY")
    session.capture("deployments")

    page.get_by_role("link", name="Trainings").click()
    row = page.locator(f"#trainings tr[data-id='{training_id}']")
    expect(row).to_contain_text("mwms-ui")
    expect(row).to_contain_text("tensorflow 2.21")
    expect(row).to_contain_text("COMPLETED")
    page.get_by_label("Status").select_option("FAILED")
    expect(row).to_have_count(0)
    page.get_by_label("Status").select_option("")
    expect(row).to_be_visible()
    session.capture("trainings")

    # Sign out: the cookie is gone and the pages ask for a key again.
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/sign-in$"))
    assert not [c for c in session.context.cookies() if c["name"] == "dlaas_session"]
    page.goto(f"/ui/trainings/{training_id}")
    expect(page).to_have_url(re.compile(r"/ui/sign-in$"))

    # Every request went to the platform, none carried the key, nothing was logged as
    # an error.
    assert session.requests
    foreign = [u for u in session.requests if not u.startswith(f"{up.url}/")]
    assert not foreign, foreign
    assert not [u for u in session.requests if key in u]
    assert not any(session.accessibility.values()), session.accessibility
    # The browser logs the refused submission's 422 itself (the page showed it next to its
    # field); anything else is an error.
    refused = "Failed to load resource: the server responded with a status of 422"
    assert not [m for m in session.console_errors if not m.startswith(refused)], (
        session.console_errors
    )


def test_a_wrong_key_shows_an_error(session: Session, up: Up) -> None:
    page = session.page
    # By keyboard alone: the key field has the focus, Enter sends the form.
    page.goto("/ui/sign-in")
    expect(page.get_by_label("API key")).to_be_focused()
    page.keyboard.type("not-a-key")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/ui/sign-in$"))
    expect(page.get_by_role("alert")).to_have_text("the API key is not valid")
    expect(page.get_by_label("API key")).to_have_attribute("aria-invalid", "true")
    assert not session.context.cookies()
    session.capture("sign-in-error")
    assert not any(session.accessibility.values()), session.accessibility
    assert all(u.startswith(f"{up.url}/") for u in session.requests)


def test_another_tenants_training_is_not_found(session: Session, up: Up, admin_key: str) -> None:
    admin = {"Authorization": f"Bearer {admin_key}"}
    r = httpx.post(f"{up.url}/v1/tenants", json={"name": "bob", "plan": "standard"}, headers=admin)
    assert r.status_code == 201, r.text
    bob = {"Authorization": f"Bearer {r.json()['api_key']}"}
    manifest = {
        "name": "bobs",
        "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 train.py"},
        "compute_configuration": {"name": "K80", "nodes": 1},
    }
    code = zip_dir(EXAMPLES / "hello")
    ids = []
    for name in ("bobs-first", "bobs-second"):
        created = httpx.post(
            f"{up.url}/v1/trainings",
            files={
                "manifest": ("m.json", json.dumps({**manifest, "name": name})),
                "model_definition": ("c.zip", code),
            },
            headers=bob,
        )
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    page = session.page

    # Bob pages through his trainings, newest first, one a page.
    sign_in(page, r.json()["api_key"])
    page.goto("/ui/trainings?limit=1")
    rows = page.locator("#trainings tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("bobs-second")
    expect(page.get_by_role("button", name="Newer")).to_be_disabled()
    page.get_by_role("button", name="Older").click()
    expect(rows).to_contain_text("bobs-first")
    expect(page.get_by_role("button", name="Older")).to_be_disabled()
    page.get_by_role("button", name="Newer").click()
    expect(rows).to_contain_text("bobs-second")
    page.get_by_role("button", name="Sign out").click()

    # Another tenant opening Bob's training's page is told it is not found.
    sign_in(page, _local_key(up))
    expect(page).to_have_url(re.compile(r"/ui/trainings$"))
    page.goto(f"/ui/trainings/{ids[0]}")
    expect(page.locator("h1")).to_have_text("Training not found")
    expect(page.locator("#error")).to_contain_text("not found")
    expect(page.locator("#log")).to_be_hidden()
    session.capture("not-found")


def test_pause_stop_and_delete_from_the_training_page(session: Session, up: Up) -> None:
    local = {"Authorization": f"Bearer {_local_key(up)}"}
    manifest = {
        "name": "ticks",
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            "command": "python3 slow.py --seconds 120 --interval 0.2",
        },
        "compute_configuration": {"name": "K80", "nodes": 1},
    }
    created = httpx.post(
        f"{up.url}/v1/trainings",
        files={
            "manifest": ("m.json", json.dumps(manifest)),
            "model_definition": ("c.zip", zip_dir(EXAMPLES / "env")),
        },
        headers=local,
    )
    assert created.status_code == 201, created.text
    training_id = created.json()["id"]
    page = session.page
    sign_in(page, _local_key(up))
    page.goto(f"/ui/trainings/{training_id}")
    log = page.locator("#log")
    expect(log).to_contain_text("tick=3", timeout=TRAINING_TIMEOUT)

    # Paused, the shown log stands still; resumed, it shows what came meanwhile.
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("button", name="Resume")).to_have_attribute("aria-pressed", "true")
    held = log.inner_text()
    page.wait_for_timeout(1500)
    assert log.inner_text() == held
    page.get_by_role("button", name="Resume").click()
    expect(log).not_to_have_text(held)

    # Stop and delete ask first; a dismissed question changes nothing.
    questions: list[str] = []

    def answer(dialog: Any) -> None:
        questions.append(dialog.message)
        (dialog.dismiss if len(questions) == 1 else dialog.accept)()

    page.on("dialog", answer)
    page.get_by_role("button", name="Stop").click()
    page.wait_for_timeout(500)
    assert (
        httpx.get(f"{up.url}/v1/trainings/{training_id}", headers=local).json()["stop_requested"]
        is False
    )
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#status")).to_have_text("HALTED", timeout=TRAINING_TIMEOUT)
    page.get_by_role("button", name="Delete").click()
    expect(page).to_have_url(re.compile(r"/ui/trainings$"))
    assert questions[0].startswith("Stop training ticks?")
    assert questions[2].startswith("Delete training ticks")
    # HALTED: nothing left to stop, so it is deleted at once.
    assert httpx.get(f"{up.url}/v1/trainings/{training_id}", headers=local).status_code == 404
    expect(page.locator(f"#trainings tr[data-id='{training_id}']")).to_have_count(0)


def _local_key(up: Up) -> str:
    config: dict[str, str] = json.loads((up.home / "client.json").read_text())
    return config["api_key"]


def test_the_training_page_says_why_a_learner_stopped_and_the_limits_once(
    session: Session, up: Up
) -> None:
    # A parameter server (learner 1) that never exits on its own: the completion rule
    # stops it when the workers complete. The page says STOPPED: the workers completed,
    # not HALTED; what the machine could not enforce is a fact of its own, not the status.
    local = {"Authorization": f"Bearer {_local_key(up)}"}
    manifest = {
        "name": "ps-stopped",
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            "command": 'if [ "$LEARNER_ID" = 1 ]; then exec sleep 120; fi; sleep 1',
            "parameter_servers": 1,
        },
        "compute_configuration": {"name": "P100", "nodes": 3},
    }
    created = httpx.post(
        f"{up.url}/v1/trainings",
        files={
            "manifest": ("m.json", json.dumps(manifest)),
            "model_definition": ("c.zip", zip_dir(EXAMPLES / "env")),
        },
        headers=local,
    )
    assert created.status_code == 201, created.text
    training_id = created.json()["id"]
    page = session.page
    sign_in(page, _local_key(up))
    page.goto(f"/ui/trainings/{training_id}")
    expect(page.locator("#status")).to_have_text("COMPLETED", timeout=TRAINING_TIMEOUT)
    # The stopped learner's exit is recorded as the training is wrapped up: then reloaded.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        learners = httpx.get(f"{up.url}/v1/trainings/{training_id}", headers=local).json()[
            "learners"
        ]
        if learners[0]["exit_code"] is not None:
            break
        time.sleep(0.3)
    page.reload()
    row = page.locator("#learners tr[data-learner='1']")
    expect(row).to_contain_text("STOPPED: the workers completed", timeout=30_000)
    expect(row).not_to_contain_text("HALTED")
    body = httpx.get(f"{up.url}/v1/trainings/{training_id}", headers=local).json()
    if body["limits_note"]:
        expect(page.locator("#facts")).to_contain_text(body["limits_note"])
        expect(page.locator("#timeline")).not_to_contain_text("enforced")
    session.capture("training-stopped-learner")
