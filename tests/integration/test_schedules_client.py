"""``taskfleet.Client``'s schedule methods and ``taskfleet schedules ...`` against the real API
under uvicorn: set, list, get, delete, the refusals as exceptions and as exit codes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import taskfleet.cli.schedules  # noqa: F401  (registers the schedules commands on the app)
from taskfleet.cli.main import app
from taskfleet.client import AsyncClient, Client
from taskfleet.errors import Forbidden, InvalidRequest, NotFound
from tests.integration.apiserver import RunningApi, running_api
from tests.integration.test_api_tasks import ADMIN, SUBMIT, api_settings


@pytest.fixture
def api(database_url: str) -> Iterator[RunningApi]:
    with running_api(api_settings(database_url)) as running:
        yield running


def test_client_schedule_methods(api: RunningApi) -> None:
    with Client(api.url, token=ADMIN) as client:
        made = client.set_schedule(
            "nightly report", "demo.echo", {"value": 1}, cron="0 3 * * *", timezone="Asia/Tokyo"
        )
        assert made.name == "nightly report" and made.timezone == "Asia/Tokyo"
        assert made.next_run_at.hour == 18  # 03:00 in Tokyo is 18:00Z
        client.set_schedule("tick", "demo.echo", every="30s", labels=["ops"], max_attempts=1)
        assert [s.name for s in client.schedules()] == ["nightly report", "tick"]
        assert client.schedule("tick").labels == ["ops"]
        with pytest.raises(InvalidRequest) as refused:
            client.set_schedule("bad", "demo.echo", cron="0 3 * *")
        assert refused.value.status == 422
        client.delete_schedule("tick")
        with pytest.raises(NotFound):
            client.schedule("tick")
        with pytest.raises(NotFound):
            client.delete_schedule("tick")
    with Client(api.url, token=SUBMIT) as reader:
        assert [s.name for s in reader.schedules()] == ["nightly report"]
        with pytest.raises(Forbidden):
            reader.delete_schedule("nightly report")


async def test_async_client_schedule_methods(api: RunningApi) -> None:
    async with AsyncClient(api.url, token=ADMIN) as client:
        made = await client.set_schedule("tick", "demo.echo", every="1m")
        assert made.every == "1m" and made.source == "api"
        assert (await client.schedule("tick")).next_run_at == made.next_run_at
        assert [s.name for s in await client.schedules()] == ["tick"]
        await client.delete_schedule("tick")
        assert await client.schedules() == []


def test_cli_schedules_commands(api: RunningApi) -> None:
    runner = CliRunner()
    env = {"TASKFLEET_URL": api.url, "TASKFLEET_TOKEN": ADMIN, "COLUMNS": "80"}

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["schedules", *args], env=env)
        return result.exit_code, result.output

    code, out = run(
        "set",
        "report.daily",
        "--type",
        "demo.echo",
        "--cron",
        "0 6 * * *",
        "--timezone",
        "Europe/Berlin",
        "--label",
        "reports",
        "--payload",
        '{"value": 2}',
    )
    assert code == 0, out
    assert "Europe/Berlin" in out and "reports" in out
    code, out = run("set", "tick", "--type", "demo.echo", "--every", "30s")
    assert code == 0, out
    code, out = run("list")
    assert code == 0, out
    assert "report.daily" in out and "0 6 * * * Europe/Berlin" in out and "every 30s" in out
    table = [line for line in out.splitlines() if "HTTP Request" not in line]
    assert all(len(line) <= 80 for line in table), out
    code, out = run("get", "tick")
    assert code == 0 and "30s" in out, out
    code, out = run("set", "bad", "--type", "demo.echo", "--cron", "99 * * * *")
    assert code == 1 and "cron" in out, out
    code, out = run("set", "bad", "--type", "demo.echo", "--every", "1m", "--cron", "* * * * *")
    assert code == 2, out
    code, out = run("delete", "tick")
    assert code == 0 and "deleted" in out, out
    code, out = run("get", "tick")
    assert code == 1 and "404" in out, out
