"""User code on a bad day, against real processes: whatever a handler returns or raises, the
attempt ends with a readable outcome and the worker goes on claiming.
"""

from __future__ import annotations

import httpx

from tests.e2e.fleet import Fleet, eventually, task_rows, wait_tasks_terminal
from tests.e2e.hostile_tasks import HOSTILE_MODULE_ENV

#: kind -> (attempts it ends with, at max_attempts=2; words its last_error must contain)
POISON = {
    "nul": (1, ["result cannot be stored", "$.text", "NUL"]),
    "surrogate": (1, ["result cannot be stored", "$.text", "surrogate"]),
    "nul_key": (1, ["result cannot be stored", "NUL"]),
    "nul_error": (2, ["RuntimeError: bad \\x00 byte in the handler's own words"]),
    "surrogate_error": (2, ["RuntimeError: lone \\udc80 surrogate in the handler's own words"]),
    "unencodable": (1, ["result is not JSON-serialisable"]),
    "nan": (1, ["result is not JSON-serialisable"]),
    "huge": (1, ["result is larger than 1 MiB"]),
}


async def _submit(client: httpx.AsyncClient, body: dict[str, object]) -> int:
    response = await client.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


async def test_every_poison_outcome_fails_readably_and_the_next_task_runs(
    database_url: str,
) -> None:
    async with Fleet(
        database_url, env={**HOSTILE_MODULE_ENV, "TASKFLEET_RETRY_BASE": "0.01"}
    ) as fleet:
        await fleet.start_api()
        worker = await fleet.start_worker("w1", concurrency=2)
        conn = await fleet.connect()
        try:
            async with fleet.client() as client:
                for kind, (attempts, words) in POISON.items():
                    poison_id = await _submit(
                        client,
                        {"type": "hostile.poison", "payload": {"kind": kind}, "max_attempts": 2},
                    )
                    rows = await wait_tasks_terminal(conn, [poison_id], timeout=30)
                    row = rows[poison_id]
                    assert row["status"] == "failed", (kind, row)
                    assert row["attempts"] == attempts, (kind, row)
                    assert row["result"] is None, kind
                    for word in words:
                        assert word in row["last_error"], (kind, word, row["last_error"])
                    # The same worker goes on: a plain task submitted after it runs.
                    plain_id = await _submit(
                        client, {"type": "demo.echo", "payload": {"value": kind}}
                    )
                    plain = (await wait_tasks_terminal(conn, [plain_id], timeout=30))[plain_id]
                    assert plain["status"] == "completed", (kind, plain)
                    assert plain["result"] == {"value": kind}
                    assert plain["worker_id"] == "w1"

            async def ready() -> bool:
                async with httpx.AsyncClient(timeout=2.0) as http:
                    return (await http.get(f"{worker.url}/readyz")).status_code == 200

            await eventually(ready, timeout=10)
            assert not await conn.fetchval(
                "SELECT count(*) FROM taskfleet.tasks WHERE status = 'running'"
            )
            assert all(
                r["status"] != "running" for r in (await task_rows(conn, [poison_id])).values()
            )
        finally:
            await conn.close()
