"""The operator console in a real browser (headless Chromium) against a real API and workers.

An operator signs in with the token in the link, sees the workers and the config version, filters
the failed tasks and retries one, retries the rest in bulk, changes the config and watches it
converge; the same on a phone-sized screen; a submit token sees but cannot act; the API
documentation works with no network. Every page and everything it loads comes from the API's
origin, and the browser reports no refused load. The screenshots in docs/console.md and the
README are taken here: run with TASKFLEET_UPDATE_SCREENSHOTS=1 (scripts/screenshots) to rewrite
them; otherwise they go to a temporary folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.e2e.browser import (
    PHONE,
    chromium,
    console_problems,
    element,
    loaded_urls,
    no_horizontal_scroll,
    screenshot,
    text_of,
    wait_for,
    wait_text,
)
from tests.e2e.fleet import ADMIN_TOKEN, SUBMIT_TOKEN, Fleet, eventually

pytestmark = pytest.mark.e2e

REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"


def screenshots_dir() -> Path:
    if os.environ.get("TASKFLEET_UPDATE_SCREENSHOTS") == "1":
        return DOCS_IMAGES
    return Path(tempfile.mkdtemp(prefix="tf-console-shots-"))


@pytest.fixture
async def fleet(database_url: str) -> AsyncIterator[Fleet]:
    async with Fleet(database_url) as running:
        await running.start_api()
        await running.start_workers("worker-1", "worker-2", concurrency=4)
        yield running


async def submit_all(fleet: Fleet, tasks: list[dict[str, Any]]) -> list[int]:
    async with fleet.client() as http:
        response = await http.post("/tasks/batch", json={"tasks": tasks})
        assert response.status_code == 201, response.text
        return [t["id"] for t in response.json()["tasks"]]


async def count(fleet: Fleet, status: str) -> int:
    conn = await fleet.connect()
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM taskfleet.tasks WHERE status = $1", status)
        )
    finally:
        await conn.close()


async def task_row(fleet: Fleet, task_id: int) -> dict[str, Any]:
    conn = await fleet.connect()
    try:
        row = await conn.fetchrow("SELECT * FROM taskfleet.tasks WHERE id = $1", task_id)
        assert row is not None
        return dict(row)
    finally:
        await conn.close()


async def a_busy_queue(fleet: Fleet) -> None:
    """Completed, failed, running and waiting tasks in every lane, as an operator would see."""
    fail = "demo.fail"
    await submit_all(
        fleet,
        [
            *(
                {"type": "demo.echo", "payload": {"value": i}, "labels": ["tenant-a"]}
                for i in range(4)
            ),
            *(
                {
                    "type": fail,
                    "payload": {"message": "card declined", "permanent": True},
                    "labels": ["tenant-a"],
                }
                for _ in range(3)
            ),
            *(
                {
                    "type": fail,
                    "payload": {"message": "bank timed out", "permanent": True},
                    "labels": ["tenant-b"],
                }
                for _ in range(2)
            ),
            {"type": "demo.sleep", "payload": {"seconds": 600}, "labels": ["tenant-b"]},
            {"type": "demo.sleep", "payload": {"seconds": 600}, "priority": 5},
            *(
                {"type": "demo.echo", "delay_seconds": 3600, "labels": ["tenant-a"]}
                for _ in range(3)
            ),
            *({"type": "demo.echo", "delay_seconds": 3600, "priority": 3} for _ in range(2)),
        ],
    )

    async def settled() -> bool:
        return await count(fleet, "failed") == 5 and await count(fleet, "completed") == 4

    await eventually(settled, timeout=60)


def same_origin(urls: list[str], origin: str) -> list[str]:
    """The URLs that do not come from ``origin`` (none, if all is well)."""
    return [u for u in urls if not (u == origin or u.startswith(origin + "/"))]


async def test_an_operator_works_through_the_console(fleet: Fleet) -> None:
    await a_busy_queue(fleet)
    origin = fleet.api_url
    shots = screenshots_dir()
    seen: list[str] = []
    with chromium() as driver:
        # Signed in by the link: the token leaves the address bar for sessionStorage.
        driver.get(f"{origin}/ui/#token={ADMIN_TOKEN}&view=workers")
        wait_text(driver, "table", "worker-2")
        rows = text_of(driver, "tbody")
        assert "worker-1" in rows and "alive" in rows
        assert ADMIN_TOKEN not in driver.current_url
        assert driver.current_url.endswith("/ui/#view=workers")
        stored = driver.execute_script("return sessionStorage.getItem('taskfleet.token')")
        assert stored == ADMIN_TOKEN
        assert "Config version 0" in text_of(driver, ".summary")
        assert "admin role" in text_of(driver, "#session")
        seen += loaded_urls(driver)
        screenshot(driver, shots / "workers.png")

        # Overview: the queue by lane and group, recent outcomes, the fleet.
        driver.get(f"{origin}/ui/#view=overview")
        wait_text(driver, ".view-overview", "Failed in the last hour")
        overview = text_of(driver, ".view-overview")
        assert "5 tasks" in overview  # failed in the last hour
        assert "Strict cap in use" in overview
        assert "2 workers" in overview
        seen += loaded_urls(driver)
        screenshot(driver, shots / "overview.png")

        # Filter the failures of tenant-a with the form.
        driver.get(f"{origin}/ui/#view=tasks")
        element(driver, "#filter-status")
        Select(element(driver, "#filter-status")).select_by_value("failed")
        element(driver, "#filter-label").send_keys("tenant-a")
        element(driver, "#apply-filters").click()
        wait_for(lambda: "label=tenant-a" in driver.current_url, "the filters in the link")
        assert driver.current_url.endswith("#view=tasks&label=tenant-a&status=failed")
        wait_for(
            lambda: len(driver.find_elements(By.CSS_SELECTOR, "a.task-link")) == 3,
            "three failed tenant-a tasks",
        )
        assert "card declined" in text_of(driver, "tbody")
        screenshot(driver, shots / "tasks.png")

        # One task: its payload and error; retry it.
        driver.find_elements(By.CSS_SELECTOR, "a.task-link")[0].click()
        wait_text(driver, "h1", "Task ")
        task_id = int(driver.current_url.rsplit("id=", 1)[1])
        before = await task_row(fleet, task_id)
        assert before["status"] == "failed"
        assert "card declined" in text_of(driver, "pre.error-text")
        screenshot(driver, shots / "task.png")
        element(driver, "#retry").click()
        wait_text(driver, ".messages", "Back in the queue")

        async def ran_again() -> bool:
            row = await task_row(fleet, task_id)
            return row["status"] == "failed" and row["finished_at"] > before["finished_at"]

        await eventually(ran_again, timeout=60)

        # Bulk: every failure of tenant-b at once.
        driver.get(f"{origin}/ui/#view=tasks&label=tenant-b&status=failed")
        wait_for(
            lambda: len(driver.find_elements(By.CSS_SELECTOR, "a.task-link")) == 2,
            "two failed tenant-b tasks",
        )
        element(driver, "#bulk-retry").click()
        alert = wait_for(lambda: driver.switch_to.alert, "the confirmation")
        assert "every failed task with the label tenant-b" in alert.text
        alert.accept()
        wait_text(driver, ".messages", "Retried 2 tasks.")
        seen += loaded_urls(driver)

        # Change the config and watch it converge on both workers.
        driver.get(f"{origin}/ui/#view=config")
        wait_text(driver, ".current", "Version")
        strict = element(driver, "#max-strict")
        strict.clear()
        strict.send_keys("50")
        weights = element(driver, "#label-weights")
        weights.clear()
        weights.send_keys("tenant-a = 5\ntenant-b = 2")
        element(driver, "#apply-config").click()
        wait_for(
            lambda: (
                driver.find_element(By.ID, "convergence").get_attribute("data-outcome")
                == "converged"
            ),
            "the change converging",
        )
        steps = text_of(driver, "#convergence .steps")
        assert "Enqueued as update task" in steps
        assert "Version 1 written" in steps
        assert "2 of 2 alive workers applied version 1" in steps
        assert "Converged: every alive worker runs version 1" in steps
        assert "request=" in driver.current_url  # a reload re-attaches to this change
        wait_text(driver, ".current", "tenant-a")
        seen += loaded_urls(driver)
        screenshot(driver, shots / "config.png")

        # Reloading the link re-attaches to the same change and shows its outcome again.
        driver.refresh()
        wait_for(
            lambda: (
                driver.find_element(By.ID, "convergence").get_attribute("data-outcome")
                == "converged"
            ),
            "the re-attached change's outcome",
        )

        # The workers now run version 1.
        driver.get(f"{origin}/ui/#view=workers")
        wait_text(driver, ".summary", "Config version 1: every alive worker runs it")
        seen += loaded_urls(driver)

        problems = console_problems(driver)
        assert not problems, problems

    assert not same_origin(seen, origin), same_origin(seen, origin)
    assert any(u.endswith("/ui/app.js") for u in seen) and any("/tasks/stats" in u for u in seen)
    # The token travelled in headers only: never in a URL the API saw.
    assert ADMIN_TOKEN not in "".join(seen)
    assert ADMIN_TOKEN not in fleet.proc("api").log()


async def test_the_console_on_a_phone(fleet: Fleet) -> None:
    await a_busy_queue(fleet)
    shots = screenshots_dir()
    with chromium(PHONE, phone=True) as driver:
        driver.get(f"{fleet.api_url}/ui/#token={ADMIN_TOKEN}&view=overview")
        wait_text(driver, ".view-overview", "Failed in the last hour")
        assert no_horizontal_scroll(driver)
        screenshot(driver, shots / "overview-phone.png")
        driver.get(f"{fleet.api_url}/ui/#view=tasks&status=failed")
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "a.task-link"), "failed tasks")
        assert no_horizontal_scroll(driver)
        screenshot(driver, shots / "tasks-phone.png")
        assert not console_problems(driver)


async def test_a_submit_token_sees_but_cannot_act(fleet: Fleet) -> None:
    await a_busy_queue(fleet)
    with chromium() as driver:
        driver.get(f"{fleet.api_url}/ui/")
        # The sign-in form, then the submit role.
        element(driver, "#token").send_keys("not-the-token")
        element(driver, "#sign-in").click()
        wait_text(driver, ".sign-in", "does not accept that token")
        element(driver, "#token").send_keys(SUBMIT_TOKEN)
        element(driver, "#sign-in").click()
        wait_text(driver, "#session", "submit role")
        wait_text(driver, ".view-overview", "Sign in with an admin token")
        driver.get(f"{fleet.api_url}/ui/#view=tasks&status=failed")
        wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "a.task-link"), "failed tasks")
        assert not driver.find_elements(By.ID, "bulk-retry")
        driver.find_elements(By.CSS_SELECTOR, "a.task-link")[0].click()
        wait_text(driver, ".details", "Attempts")
        assert not driver.find_elements(By.ID, "retry")
        driver.get(f"{fleet.api_url}/ui/#view=config")
        wait_text(driver, "main", "needs a token with the admin role")
        # Sign out: the token is gone from this tab.
        element(driver, "#session button").click()
        element(driver, "#token")
        assert driver.execute_script("return sessionStorage.getItem('taskfleet.token')") is None
        assert not console_problems(driver)


async def test_the_api_documentation_works_offline(database_url: str) -> None:
    """/docs (Swagger UI) and /redoc render the API from files the API serves itself: the browser
    can resolve no other host, and nothing is loaded from anywhere else."""
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        origin = fleet.api_url
        with chromium() as driver:
            driver.get(f"{origin}/docs")
            wait_for(
                lambda: len(driver.find_elements(By.CSS_SELECTOR, ".opblock")) > 10,
                "Swagger UI's operations",
            )
            assert "/tasks/stats" in text_of(driver, ".opblock-summary-path")
            docs_urls = loaded_urls(driver)
            assert not console_problems(driver), console_problems(driver)
            driver.get(f"{origin}/redoc")
            wait_text(driver, "body", "Submit a task")
            redoc_urls = loaded_urls(driver)
            # ReDoc's sidebar asks for Redocly's logo from its CDN; the Content-Security-Policy
            # refuses it (so nothing leaves this machine) and ReDoc drops the image on the
            # error. That refusal is the one message allowed here.
            refused = console_problems(driver)
            assert all(REDOCLY_LOGO in p for p in refused), refused
            assert not driver.find_elements(By.CSS_SELECTOR, "img[alt='redocly logo']")
    assert not same_origin(docs_urls, origin), same_origin(docs_urls, origin)
    # The logo ReDoc asked for and the policy refused (above): listed as tried, never loaded.
    assert set(same_origin(redoc_urls, origin)) <= {REDOCLY_LOGO}, same_origin(redoc_urls, origin)
    assert any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in docs_urls)
    assert any(u.endswith("/openapi.json") for u in docs_urls)
    assert any(u.endswith("/docs/assets/redoc.standalone.js") for u in redoc_urls)
