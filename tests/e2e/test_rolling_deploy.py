"""A rolling deploy with real processes: a worker that does not know a new task type leaves it
pending for one that does (before, it claimed it and failed it for good: "no handler for task
type"), and the API says which pending tasks no alive worker can run.
"""

from __future__ import annotations

from tests.e2e.fleet import Fleet, eventually, scrape_metric, task_rows, wait_tasks_terminal
from tests.e2e.hostile_tasks import HOSTILE_MODULE_ENV

UNRUNNABLE = "taskfleet_queue_unrunnable_tasks"


async def test_a_type_only_the_new_version_knows_waits_for_a_worker_that_knows_it(
    database_url: str,
) -> None:
    # The API (new version) knows hostile.*; the old worker does not.
    async with Fleet(database_url, env=HOSTILE_MODULE_ENV) as fleet:
        await fleet.start_api()
        await fleet.start_worker("old", extra_env={"TASKFLEET_TASK_MODULES": ""})
        conn = await fleet.connect()
        try:
            async with fleet.client() as client:
                new = await client.post(
                    "/tasks",
                    json={"type": "hostile.barrier", "payload": {"parties": 1}},
                )
                assert new.status_code == 201, new.text
                new_id = new.json()["id"]
                # The old worker runs what it knows, submitted after the new type ...
                old = await client.post("/tasks", json={"type": "demo.echo", "payload": {}})
                old_id = old.json()["id"]
                done = await wait_tasks_terminal(conn, [old_id], timeout=30)
                assert (done[old_id]["status"], done[old_id]["worker_id"]) == ("completed", "old")
                # ... and leaves the new type pending, never failed.
                row = (await task_rows(conn, [new_id]))[new_id]
                assert (row["status"], row["attempts"]) == ("pending", 0), row

                metrics = f"{fleet.api_url}/metrics"

                async def unrunnable(count: float) -> bool:
                    value = await scrape_metric(metrics, UNRUNNABLE, reason="unknown_type")
                    return value == count

                await eventually(lambda: unrunnable(1), timeout=15)
                workers = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
                assert "demo.echo" in workers["old"]["task_types"]
                assert "hostile.barrier" not in workers["old"]["task_types"]

                # The new version's worker arrives and runs it.
                await fleet.start_worker("new")
                done = await wait_tasks_terminal(conn, [new_id], timeout=30)
                assert (done[new_id]["status"], done[new_id]["worker_id"]) == ("completed", "new")
                await eventually(lambda: unrunnable(0), timeout=15)
                workers = {w["id"]: w for w in (await client.get("/workers")).json()["workers"]}
                assert "hostile.barrier" in workers["new"]["task_types"]
        finally:
            await conn.close()
