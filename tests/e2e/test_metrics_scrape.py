"""The dashboard's queries use only metrics that a real API and a real worker expose.

The offline deploy test derives the exported names from the code; this one scrapes the running
processes after they did real work (tasks run, a retry, a failure, a config change), so a metric
that is defined but never registered in a process, or renamed, fails here.
"""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.fleet import Fleet, eventually
from tests.integration.test_deploy_files import (
    _SAMPLE_SUFFIXES,
    dashboard_expressions,
    dashboards,
    promql_metric_names,
)


def exposed_names(text: str) -> tuple[set[str], set[str]]:
    """(every sample name the exposition's families can carry, the sample names present)."""
    possible: set[str] = set()
    present: set[str] = set()
    for family in text_string_to_metric_families(text):
        possible.update(family.name + suffix for suffix in _SAMPLE_SUFFIXES[family.type])
        present.update(sample.name for sample in family.samples)
    return possible, present


async def test_dashboard_metrics_are_exposed_by_the_running_processes(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1", concurrency=4)
        async with fleet.client() as client:
            ids = []
            for task in (
                {"type": "demo.echo", "payload": {"value": 1}},
                {"type": "demo.echo", "payload": {"value": 2}, "priority": 5},
                {"type": "demo.fail", "payload": {"message": "x"}, "max_attempts": 1},
                {"type": "demo.echo", "payload": {}, "labels": ["a"]},
            ):
                response = await client.post("/tasks", json=task)
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
            for task_id in ids:
                waited = await client.get(f"/tasks/{task_id}/wait", params={"timeout": 30})
                assert waited.json()["finished"], waited.text
            put = await client.put(
                "/runtime-config",
                json={"maxStrictPercentage": 50, "labelWeights": {"a": 2}},
                headers={"Accept": "application/json"},
            )
            assert put.status_code == 200, put.text
            assert put.json()["outcome"] == "converged", put.text

            async def scrape(url: str) -> str:
                async with httpx.AsyncClient(timeout=10) as plain:
                    response = await plain.get(url)
                    assert response.status_code == 200
                    return response.text

            worker_text = await scrape(f"http://127.0.0.1:{worker.port}/metrics")

            async def api_scrape_has_queue_gauges() -> str | None:
                text = await scrape(f"{fleet.api_url}/metrics")
                return text if "taskfleet_queue_depth" in text else None

            api_text = await eventually(api_scrape_has_queue_gauges)

    worker_possible, worker_present = exposed_names(worker_text)
    api_possible, api_present = exposed_names(api_text)
    exposed = worker_possible | api_possible

    # Work really moved the metrics (not just registered them).
    for name in (
        "taskfleet_worker_claimed_tasks_total",
        "taskfleet_task_outcomes_total",
        "taskfleet_task_duration_seconds_bucket",
        "taskfleet_task_wait_seconds_count",
        "anclax_worker_runtime_config_version",
        "anclax_runtime_config_convergence_seconds_count",
        "taskfleet_worker_listener_connected",
    ):
        assert name in worker_present, f"{name} missing from the worker's scrape"
    for name in ("taskfleet_queue_depth", "taskfleet_workers_alive", "http_requests_total"):
        assert name in api_present, f"{name} missing from the API's scrape"
    assert "anclax_worker_runtime_config_version 1.0" in worker_text
    assert "anclax_worker_strict_cap 2.0" in worker_text  # ceil(4 * 50 / 100)

    unknown: dict[str, set[str]] = {}
    for path in dashboards():
        for where, expr in dashboard_expressions(json.loads(path.read_text())):
            missing = promql_metric_names(expr) - exposed
            if missing:
                unknown[f"{path.name}: {where}"] = missing
    assert not unknown, f"dashboard queries name metrics no running process exposes: {unknown}"
