"""The deployment files hold together: Dockerfile, compose, Prometheus, Grafana, the env example.

Offline: no Docker engine, no network, no database. The compose file is checked against the
compose-spec schema (vendored by check-jsonschema) and then against what this project needs; every
dashboard expression is parsed and may only name metrics the code exports.

``exported_metric_names()`` is the one list of metric names the dashboard may use. A test that
scrapes a running API and worker can compare its scrape (``metric_names_in_exposition``) with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_fastapi_instrumentator import metrics as instrumentator_metrics

from taskfleet.api.metrics import QueueGauges
from taskfleet.shared.metrics import ApiMetrics, WorkerMetrics

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_FILE = REPO / "deploy" / "prometheus" / "prometheus.yml"
DATASOURCE_FILE = REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER_FILE = REPO / "grafana" / "provisioning" / "dashboards" / "taskfleet.yml"
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
ENV_EXAMPLE = REPO / ".env.example"
OPERATIONS_DOC = REPO / "docs" / "operations.md"

#: Services that run once and exit; every other service must define a health check.
ONE_SHOT_SERVICES = {"migrate"}
#: The long-running taskfleet processes, which must wait for the migration.
APP_SERVICES = {"api", "worker"}
SECRET_VARIABLES = {"POSTGRES_PASSWORD", "TASKFLEET_API_TOKENS", "GRAFANA_ADMIN_PASSWORD"}


# --- metric names the code exports ---------------------------------------------------------------

#: Sample names a metric family of each type exports (prometheus_client, text format 0.0.4).
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry's metric families can export.

    Derived from the family type rather than from the collected samples, because a labelled
    metric exports no sample until its first label combination is used.
    """
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SAMPLE_SUFFIXES[family.type])
    return names


def metric_names_in_exposition(text: str) -> set[str]:
    """Sample names in a Prometheus text exposition (a scraped /metrics body)."""
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def taskfleet_registries() -> list[CollectorRegistry]:
    """Registries holding the metrics as the worker and the API register them (HTTP excluded)."""
    worker = CollectorRegistry()
    WorkerMetrics.create(worker)
    api = CollectorRegistry()
    # The API registers ApiMetrics plus its own scrape-time gauges (taskfleet_api_database_up).
    QueueGauges(ApiMetrics.create(api), api)
    return [worker, api]


def exported_metric_names() -> frozenset[str]:
    """The metric (sample) names the API and the workers export.

    Built from the code itself: ``taskfleet.shared.metrics`` (WorkerMetrics, ApiMetrics), the
    API's extra gauges, and the HTTP metrics of prometheus-fastapi-instrumentator's ``default()``
    set, which the API installs without a namespace. Extend it here if a process starts
    exporting more.
    """
    http = CollectorRegistry()
    instrumentator_metrics.default(registry=http)
    names: set[str] = set()
    for registry in [*taskfleet_registries(), http]:
        names |= sample_names(registry)
    return frozenset(names)


def taskfleet_metric_families() -> dict[str, str]:
    """Family name -> type of taskfleet's own metrics (the instrumentator's excluded)."""
    return {
        family.name: family.type
        for registry in taskfleet_registries()
        for family in registry.collect()
    }


def test_exported_names_cover_what_prometheus_client_really_emits() -> None:
    for registry in taskfleet_registries():
        emitted = {s.name for family in registry.collect() for s in family.samples}
        assert emitted, "unlabelled metrics export samples from the start"
        assert emitted <= sample_names(registry)

    names = exported_metric_names()
    for expected in (
        "anclax_worker_strict_saturation_total",  # a counter gets _total appended
        "anclax_runtime_config_convergence_seconds_bucket",
        "taskfleet_worker_claimed_tasks_total",  # labelled: no sample until first use
        "taskfleet_queue_depth",
        "taskfleet_api_database_up",
        "http_requests_total",
        "http_request_duration_highr_seconds_bucket",
        "http_request_duration_seconds_count",
    ):
        assert expected in names
    assert "anclax_worker_strict_saturation" not in names


# --- a small PromQL reader -----------------------------------------------------------------------

#: Aggregation operators and functions (Prometheus 3). An identifier followed by "(" must be one.
_PROMQL_FUNCTION_NAMES = """
    sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk
    limit_ratio abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month
    day_of_week day_of_year days_in_month delta deriv exp floor histogram_avg histogram_count
    histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
    double_exponential_smoothing holt_winters hour idelta increase info irate label_join
    label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort
    sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year avg_over_time
    min_over_time max_over_time sum_over_time count_over_time quantile_over_time
    stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
    acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg pi rad
"""
_PROMQL_KEYWORD_NAMES = (
    "by without on ignoring group_left group_right bool and or unless offset atan2"
)
PROMQL_FUNCTIONS = frozenset(_PROMQL_FUNCTION_NAMES.split())
PROMQL_KEYWORDS = frozenset([*_PROMQL_KEYWORD_NAMES.split(), "inf", "nan"])

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE_OR_SUBQUERY = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# Not preceded by a word character, ":", "." or "$": skips the "m" of 5m, the "e" of 1e3 and
# Grafana variables such as $__range.
_IDENTIFIER = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")
_PAIRS = {")": "(", "]": "[", "}": "{"}


class PromQLError(ValueError):
    pass


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Raises ``PromQLError`` on unbalanced brackets, an unknown function, or an expression that
    selects no metric at all. Enough PromQL for dashboards and alert rules, not a full parser:
    label values (strings), label matchers, ranges, and by/on/... label lists are stripped first,
    and what remains is operators, numbers, functions and metric names.
    """
    text = _STRING.sub('""', expr)
    stack: list[str] = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in _PAIRS:
            opened = stack.pop() if stack else None
            if opened != _PAIRS[ch]:
                raise PromQLError(f"unbalanced {ch!r} in {expr!r}")
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {expr!r}")

    text = _LABEL_MATCHERS.sub(" ", text)
    text = _RANGE_OR_SUBQUERY.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if text[match.end() :].lstrip().startswith("("):
            if word not in PROMQL_FUNCTIONS:
                raise PromQLError(f"unknown function {word!r} in {expr!r}")
        elif word.lower() not in PROMQL_KEYWORDS:
            names.add(word)
    if not names:
        raise PromQLError(f"no metric selected in {expr!r}")
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "sum by (lane, group) (rate(taskfleet_worker_claimed_tasks_total[$__rate_interval]))",
            {"taskfleet_worker_claimed_tasks_total"},
        ),
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job="api", le="0.5"}[5m])))',
            {"a_bucket"},
        ),
        ("count(a < scalar(max(b))) or vector(0)", {"a", "b"}),
        (
            "sum(rate(a[5m])) by (handler) / ignoring (group) group_left () sum(b offset 1h)",
            {"a", "b"},
        ),
        ('up{job="a{b}", x=~"(c"} == 1e3', {"up"}),
        ("max_over_time(a[1h:5m]) > bool 2", {"a"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(a[5m])",
        'a{job="x"',
        "rate(a[5m]))",
        "rtae(a[5m])",
        "histogram_quantile(0.5, sum by (le) (rate(x[5m]))",
        "sum(vector(1))",
    ],
)
def test_promql_metric_names_rejects(expr: str) -> None:
    with pytest.raises(PromQLError):
        promql_metric_names(expr)


# --- dashboard -----------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboards() -> list[Path]:
    found = sorted(DASHBOARD_DIR.glob("*.json"))
    assert found, f"no dashboard in {DASHBOARD_DIR}"
    return found


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        where = f"variable {variable.get('name')!r}"
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        if match := re.fullmatch(r"\s*label_values\((.*)\)\s*", query):
            selector, _, _label = match.group(1).rpartition(",")
            if selector:  # label_values(label) alone selects no metric
                yield where, selector
        elif match := re.fullmatch(r"\s*query_result\((.*)\)\s*", query):
            yield where, match.group(1)
        else:
            yield where, query


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_dashboard_uses_only_exported_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    exported = exported_metric_names()
    expressions = list(dashboard_expressions(dashboard))
    assert expressions, "the dashboard has no queries"
    unknown: dict[str, set[str]] = {}
    for where, expr in expressions:
        missing = promql_metric_names(expr) - exported
        if missing:
            unknown[where] = missing
    assert not unknown, f"metrics the code does not export: {unknown}"


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_dashboard_shows_every_taskfleet_metric(path: Path) -> None:
    """A metric added to shared/metrics.py without a panel is a metric nobody looks at."""
    dashboard = json.loads(path.read_text())
    used: set[str] = set()
    for _, expr in dashboard_expressions(dashboard):
        used |= promql_metric_names(expr)
    unseen = {
        family
        for family, kind in taskfleet_metric_families().items()
        if not any(family + suffix in used for suffix in _SAMPLE_SUFFIXES[kind])
    }
    assert not unseen, f"add a panel to {path.name} for: {sorted(unseen)}"


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_dashboard_is_provisionable(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    datasource_uids = {ds["uid"] for ds in load_yaml(DATASOURCE_FILE)["datasources"]}
    assert dashboard.get("uid"), "a fixed uid keeps links stable across re-provisioning"
    assert dashboard.get("id") is None, "provisioned dashboards must not carry a database id"

    panels = list(walk_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
        for ref in refs:
            if ref is not None and panel["type"] != "row":
                assert ref["uid"] in datasource_uids, f"{panel['title']}: unknown datasource {ref}"
        ref_ids = [t["refId"] for t in panel.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


# --- compose -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return document


def check_jsonschema(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_file_matches_the_compose_spec() -> None:
    result = check_jsonschema("--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_check_catches_a_bad_file(tmp_path: Path) -> None:
    # The positive check above is worth something only if the same call can fail.
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  api:\n    image: x\n    healthcheck:\n      intervall: 5s\n")
    result = check_jsonschema("--builtin-schema", "vendor.compose-spec", str(bad))
    assert result.returncode != 0, result.stdout


def parse_duration(value: str | int | float) -> float:
    """A compose duration ("30s", "1m30s", "1500ms") in seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a compose duration: {value!r}")
    return sum(float(n) * units[u] for n, u in parts)


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def option(command: list[str], name: str) -> str | None:
    if name in command:
        return command[command.index(name) + 1]
    prefix = name + "="
    return next((arg[len(prefix) :] for arg in command if arg.startswith(prefix)), None)


def api_port(service: dict[str, Any]) -> int:
    value = option(service["command"], "--port") or service_environment(service).get(
        "TASKFLEET_PORT", "8000"
    )
    return int(value)


def worker_metrics_port(service: dict[str, Any]) -> int:
    value = option(service["command"], "--metrics-port") or service_environment(service).get(
        "TASKFLEET_METRICS_PORT", "9100"
    )
    return int(value)


def test_compose_runs_the_whole_fleet(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "migrate", "api", "worker", "prometheus", "grafana"} <= services.keys()
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["migrate"]["command"] == ["migrate"]
    assert services["api"]["command"][0] == "api"
    assert services["worker"]["command"][0] == "worker"
    for name in ("migrate", *APP_SERVICES):
        build = services[name]["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (REPO / context / "Dockerfile").resolve() == DOCKERFILE, name


def test_every_long_running_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if name in ONE_SHOT_SERVICES:
            assert "healthcheck" not in service, f"{name} exits; a health check would flap"
            continue
        check = service.get("healthcheck")
        assert check and not check.get("disable") and check.get("test"), name

    def probe(name: str) -> str:
        return " ".join(compose["services"][name]["healthcheck"]["test"])

    services = compose["services"]
    assert f"127.0.0.1:{api_port(services['api'])}/healthz" in probe("api")
    assert f"127.0.0.1:{worker_metrics_port(services['worker'])}/healthz" in probe("worker")
    assert "pg_isready" in probe("postgres")


def test_migrate_gates_the_app_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["migrate"].get("restart", "no") == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in APP_SERVICES:
        depends_on = services[name]["depends_on"]
        assert depends_on["migrate"]["condition"] == "service_completed_successfully", name
        assert depends_on["postgres"]["condition"] == "service_healthy", name


def test_the_api_shuts_down_before_docker_kills_it(compose: dict[str, Any]) -> None:
    # No stop_grace_period: Docker's 10 s default equalled uvicorn's graceful shutdown, so the
    # lifespan's teardown after it could be SIGKILLed.
    from taskfleet.api.server import GRACEFUL_SHUTDOWN_SECONDS

    grace = parse_duration(compose["services"]["api"].get("stop_grace_period", "10s"))
    assert grace > GRACEFUL_SHUTDOWN_SECONDS


def test_workers_drain_before_docker_kills_them(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    drain_timeout = float(service_environment(worker).get("TASKFLEET_DRAIN_TIMEOUT", "20"))
    grace = parse_duration(worker.get("stop_grace_period", "10s"))
    assert grace > drain_timeout, "Docker would SIGKILL workers in the middle of draining"


def test_an_init_process_reaps_the_workers_orphans(compose: dict[str, Any]) -> None:
    # Without an init the worker is PID 1 of its container, and every process a killed
    # process-isolated handler left behind would stay a zombie under it (Kubernetes: the
    # worker pod shares its process namespace, test_k8s_manifests.py).
    assert compose["services"]["worker"].get("init") is True


def test_workers_scale_without_collisions(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["deploy"]["replicas"] == 3
    assert "container_name" not in worker, "a fixed name allows one replica only"
    assert "ports" not in worker, "a published host port allows one replica only"


def test_secrets_are_required_from_the_environment(compose: dict[str, Any]) -> None:
    raw = COMPOSE_FILE.read_text()
    for variable in SECRET_VARIABLES:
        assert re.search(r"\$\{" + variable + r":\?[^}]+\}", raw), variable
        assert not re.search(r"\$\{" + variable + r"(:?-|\})", raw), f"{variable} has a default"
    for name, service in compose["services"].items():
        for key, value in service_environment(service).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", value), f"{name}.{key} is a literal"


def test_env_example_documents_every_variable_compose_reads() -> None:
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text()))
    documented = set(
        re.findall(r"^#?\s*([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), flags=re.MULTILINE)
    )
    assert used <= documented, f"missing from .env.example: {sorted(used - documented)}"
    active = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), flags=re.MULTILINE))
    assert active >= SECRET_VARIABLES
    assert ".env" in (REPO / ".gitignore").read_text().split()


# --- Prometheus and Grafana ----------------------------------------------------------------------


def scrape_targets(job: dict[str, Any]) -> set[tuple[str, int, str]]:
    """(host, port, how) for a scrape job: how is "static" or "dns"."""
    targets: set[tuple[str, int, str]] = set()
    for static in job.get("static_configs", []):
        for target in static["targets"]:
            host, port = target.rsplit(":", 1)
            targets.add((host, int(port), "static"))
    for dns in job.get("dns_sd_configs", []):
        assert dns.get("type", "SRV") == "A", "compose DNS answers A records, not SRV"
        targets.update((name, int(dns["port"]), "dns") for name in dns["names"])
    return targets


def mount_target(service: dict[str, Any], source: str) -> str:
    for volume in service.get("volumes", []):
        parts = (
            volume.split(":") if isinstance(volume, str) else [volume["source"], volume["target"]]
        )
        if Path(REPO / parts[0]).resolve() == (REPO / source).resolve():
            return parts[1]
    raise AssertionError(f"{source} is not mounted")


def test_prometheus_scrapes_the_api_and_every_worker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    config = load_yaml(PROMETHEUS_FILE)
    jobs = {job["job_name"]: scrape_targets(job) for job in config["scrape_configs"]}
    by_host = {
        host: (job, port, how) for job, targets in jobs.items() for host, port, how in targets
    }

    assert by_host["api"][1] == api_port(services["api"])
    # Every replica, not whichever one the service name happens to resolve to.
    assert by_host["worker"][1:] == (worker_metrics_port(services["worker"]), "dns")
    for host in by_host:
        assert host == "localhost" or host in services, f"scrape target {host} is not a service"

    prometheus = services["prometheus"]
    assert mount_target(prometheus, "deploy/prometheus/prometheus.yml") == (
        "/etc/prometheus/prometheus.yml"
    )


def test_grafana_provisioning_points_at_the_mounted_files(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    assert mount_target(grafana, "grafana/provisioning") == "/etc/grafana/provisioning"
    dashboards_dir = mount_target(grafana, "grafana/dashboards")
    provider = load_yaml(DASHBOARD_PROVIDER_FILE)["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == dashboards_dir

    (datasource,) = load_yaml(DATASOURCE_FILE)["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]
    assert "GF_SECURITY_ADMIN_PASSWORD" in service_environment(grafana)


# --- Dockerfile and build context ----------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = (line.strip() for line in text.splitlines())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_builds_a_slim_non_root_image() -> None:
    instructions = dockerfile_instructions()
    args = dict(arg.split("=", 1) for kind, arg in instructions if kind == "ARG" and "=" in arg)
    bases = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value.split()[0])
        for kind, value in instructions
        if kind == "FROM"
    ]
    assert bases and all(base == "python:3.11-slim" for base in bases), bases

    final_stage = instructions[max(i for i, (k, _) in enumerate(instructions) if k == "FROM") :]
    users = [value for kind, value in final_stage if kind == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    entrypoints = [json.loads(value) for kind, value in final_stage if kind == "ENTRYPOINT"]
    assert entrypoints == [["taskfleet"]], "exec form, so SIGTERM reaches taskfleet"
    assert not any(kind == "HEALTHCHECK" for kind, _ in instructions), "compose defines them"
    for kind, value in instructions:
        if kind in {"ENV", "ARG"}:
            assert not re.search(r"PASSWORD|TOKEN|SECRET|DATABASE_URL", value), value
    assert any(kind == "RUN" and "pip install" in value for kind, value in instructions)


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the build context (last matching pattern wins; a
    pattern matches a path or any of its parent directories)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/")):
            out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        return re.compile(out)

    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        compiled = regex(raw[1:] if negate else raw)
        if any(compiled.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def test_build_context_holds_the_package_and_no_secrets() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = pyproject["tool"]["setuptools"]

    def both_paths(path: Path) -> list[str]:
        # taskfleet/shared/x.py is a link into shared/: the build needs the link and its target.
        return sorted({str(path.relative_to(REPO)), str(path.resolve().relative_to(REPO))})

    needed = ["pyproject.toml"]
    for package in setuptools["packages"]:
        directory = REPO.joinpath(*package.split("."))
        files = sorted(directory.glob("*.py"))
        assert files, f"package {package} has no files"
        data = setuptools.get("package-data", {}).get(package, [])
        files += [f for pattern in data for f in directory.glob(pattern)]
        needed += [p for f in files for p in both_paths(f)]
    left_out = [path for path in needed if dockerignore_excludes(path, patterns)]
    assert not left_out, f".dockerignore drops files `pip install .` needs: {left_out}"

    for private in (".env", ".venv/bin/python", ".git/config", "tests/conftest.py", "a/.env"):
        assert dockerignore_excludes(private, patterns), private
    assert dockerignore_excludes("shared/__pycache__/metrics.cpython-311.pyc", patterns)


# --- docs ----------------------------------------------------------------------------------------


def test_operations_doc_explains_every_metric() -> None:
    doc = OPERATIONS_DOC.read_text()
    missing = []
    for family, kind in taskfleet_metric_families().items():
        exported = family + "_total" if kind == "counter" else family
        if f"`{exported}`" not in doc:
            missing.append(exported)
    assert not missing, f"docs/operations.md has no row for: {missing}"


#: Series Prometheus adds itself for every scrape target; alert rules may use them.
PROMETHEUS_TARGET_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def test_operations_doc_alert_rules_use_exported_metrics() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", OPERATIONS_DOC.read_text(), flags=re.DOTALL)
    rules = [
        rule
        for block in blocks
        if "groups:" in block
        for group in yaml.safe_load(block)["groups"]
        for rule in group["rules"]
    ]
    assert rules, "docs/operations.md has no alert rules"
    allowed = exported_metric_names() | PROMETHEUS_TARGET_SERIES
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        unknown = promql_metric_names(rule["expr"]) - allowed
        assert not unknown, f"{rule['alert']}: metrics the code does not export: {unknown}"
        parse_duration(rule.get("for", "0s"))
