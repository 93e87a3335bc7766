"""The core path with real processes: submit over HTTP, a worker process runs it, result stored."""

from __future__ import annotations

from tests.e2e.fleet import Fleet, eventually


async def test_submit_run_result_with_two_workers(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        await fleet.start_api()
        await fleet.start_worker("w1")
        await fleet.start_worker("w2")
        async with fleet.client() as client:
            created = await client.post(
                "/tasks", json={"type": "demo.echo", "payload": {"value": 7}}
            )
            assert created.status_code == 201, created.text
            task_id = created.json()["id"]
            waited = await client.get(f"/tasks/{task_id}/wait", params={"timeout": 20})
            assert waited.status_code == 200, waited.text
            task = waited.json()
            assert task["status"] == "completed"
            assert task["result"] == {"value": 7}
            assert task["worker_id"] in {"w1", "w2"}

            async def both_alive() -> bool:
                workers = (await client.get("/workers")).json()["workers"]
                return sum(1 for w in workers if w["alive"]) == 2

            await eventually(both_alive)
