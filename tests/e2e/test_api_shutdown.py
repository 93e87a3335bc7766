"""The API stopping (SIGTERM) with long requests open, a real process: a pending task wait
answers with the task as it is, a config stream ends cleanly (its client re-attaches by request
id), a blocking config request answers 503 with Retry-After; never a 500, never an ASGI
traceback, and the process exits promptly. (Before, they hung until uvicorn's graceful timeout
and were then cut off: a 500 and a traceback.)
"""

from __future__ import annotations

import asyncio
import json
import signal

from tests.e2e.fleet import Fleet


async def test_sigterm_answers_pending_waits_and_streams(database_url: str) -> None:
    async with Fleet(database_url) as fleet:
        api = await fleet.start_api()  # no worker: nothing finishes, nothing converges
        async with fleet.client(timeout=60) as client:
            task = (await client.post("/tasks", json={"type": "demo.echo"})).json()
            wait = asyncio.create_task(
                client.get(f"/tasks/{task['id']}/wait", params={"timeout": 120})
            )
            blocking = asyncio.create_task(
                client.put(
                    "/runtime-config",
                    params={"timeout": 600},
                    json={"requestID": "blocking"},
                    headers={"Accept": "application/json"},
                )
            )
            # The blocking PUT is in the API (its change is enqueued) before the stop: sent
            # later, it would meet a closed connection, not the 503 under test.
            for _ in range(600):
                known = await client.get("/runtime-config/requests/blocking")
                if known.status_code != 404:
                    break
                await asyncio.sleep(0.05)
            assert known.status_code == 200, known.text
            lines: list[dict[str, object]] = []
            async with client.stream(
                "PUT",
                "/runtime-config",
                params={"timeout": 600},
                json={"requestID": "streamed"},
                headers={"Accept": "application/x-ndjson"},
            ) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if not line.strip():
                        continue
                    lines.append(json.loads(line))
                    if len(lines) == 1:  # the stream is open: stop the API now
                        api.signal(signal.SIGTERM)
            # The stream ended cleanly, without an outcome (the change goes on).
            assert lines[0]["event"] == "enqueued"
            assert all(e["event"] not in ("converged", "failed") for e in lines)
            answered = await asyncio.wait_for(wait, 30)
            assert answered.status_code == 200, answered.text
            assert (answered.json()["finished"], answered.json()["status"]) == (False, "pending")
            refused = await asyncio.wait_for(blocking, 30)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["location"] == "/runtime-config/requests/blocking"
        # uvicorn re-raises the signal it caught once it has shut down cleanly.
        assert await asyncio.to_thread(api.wait, 30) in (0, -signal.SIGTERM)
        log = api.log()
        assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
        assert " 500 " not in log
