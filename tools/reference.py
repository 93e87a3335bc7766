"""The generated parts of the repository's reference, rewritten from the code.

``docs/openapi.json`` is the API's own OpenAPI document (``create_app(...).openapi()``), and
``docs/reference.md`` holds blocks between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->`` that are made here: the HTTP routes, the environment variables
(from the settings classes), the CLI (its ``--help``), the metrics (from the registries the
processes fill) and the public Python names (``taskfleet.__all__``). The prose around the blocks
is written by hand.

    scripts/gen-reference           rewrite every generated part
    scripts/gen-reference --check   change nothing; exit 1 naming each part that drifted

Nothing here connects to anything. The environment of the shell running it is set aside while
it runs, so a ``TASKFLEET_*`` variable set there cannot leak into the documented defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference.md"
OPENAPI = REPO / "docs" / "openapi.json"

#: The width the CLI's help is rendered at, so the text does not depend on the terminal.
HELP_COLUMNS = 100

_BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED: (?P<name>[a-z-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- END GENERATED: (?P=name) -->)",
    re.DOTALL,
)


# --------------------------------------------------------------------------------------------
# A clean environment


@contextlib.contextmanager
def clean_environment() -> Iterator[None]:
    """Run with no ``TASKFLEET_*``/``DATABASE_URL`` variables and a fixed terminal width."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("TASKFLEET_") or key == "DATABASE_URL":
            del os.environ[key]
    os.environ.update({"COLUMNS": str(HELP_COLUMNS), "TERMINAL_WIDTH": str(HELP_COLUMNS)})
    os.environ.pop("FORCE_COLOR", None)
    os.environ["NO_COLOR"] = "1"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _cell(text: object) -> str:
    """One markdown table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    text = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    return text.replace("``", "`")  # reStructuredText literals read as markdown ones


# --------------------------------------------------------------------------------------------
# The API


def api_app() -> Any:
    """The control plane's FastAPI app, built as ``taskfleet api`` builds it (no connection)."""
    from taskfleet.api.app import create_app
    from taskfleet.shared.settings import ApiSettings

    settings = ApiSettings(
        database_url="postgresql://localhost/taskfleet", api_tokens="admin:documentation"
    )
    return create_app(settings)


def openapi_text() -> str:
    """``docs/openapi.json``: the document the API serves at ``/openapi.json``."""
    return json.dumps(api_app().openapi(), indent=2, ensure_ascii=False) + "\n"


_HTTP_METHODS = ("get", "put", "post", "patch", "delete")


def render_http_routes() -> str:
    document = api_app().openapi()
    rows = []
    for path, item in document["paths"].items():
        for method in _HTTP_METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            statuses = ", ".join(sorted(str(code) for code in operation.get("responses", {})))
            summary = operation.get("summary", "")
            description = operation.get("description", "")
            if description and (not summary or summary.istitle()):
                # FastAPI's summary made from the function name says less than the docstring.
                summary = _first_paragraph(description).split(". ")[0].rstrip(".")
            rows.append([f"`{method.upper()} {path}`", summary, statuses])
    return _table(["route", "does", "documented statuses"], rows)


# --------------------------------------------------------------------------------------------
# Environment


def settings_classes() -> list[type[Any]]:
    """Every settings class of ``taskfleet.shared.settings``, in the order they are defined."""
    from pydantic_settings import BaseSettings

    module = importlib.import_module("taskfleet.shared.settings")
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseSettings)
        and value.__module__ == module.__name__
    ]


def setting_variables(cls: type[Any], name: str) -> list[str]:
    """The environment variables that set field ``name`` of settings class ``cls``."""
    from pydantic import AliasChoices

    field = cls.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str) and c.isupper()]
    if isinstance(alias, str):
        return [alias]
    prefix = cls.model_config.get("env_prefix", "")
    return [f"{prefix}{name}".upper()]


def _type_name(name: str, annotation: Any, metadata: list[Any]) -> str:
    from pydantic import SecretStr

    args = typing.get_args(annotation)
    if type(None) in args:  # X | None: optional, shown by its default
        annotation = next(a for a in args if a is not type(None))
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if name.endswith("_url"):
        return "Postgres URL"
    if name.startswith("retention_"):
        return "duration (2s, 15m, 24h, 7d) or never"
    if annotation is SecretStr:
        return "secret string"
    if typing.get_origin(annotation) is list:
        return "comma-separated list"
    rules = []
    for item in metadata:
        for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                rules.append(f"{symbol} {getattr(item, attr)}")
        if getattr(item, "max_length", None) is not None:
            rules.append(f"at most {item.max_length} characters")
    base = getattr(annotation, "__name__", str(annotation))
    base = {"str": "string", "float": "seconds" if _is_timer(name) else "float"}.get(base, base)
    return base + (f" ({', '.join(rules)})" if rules else "")


def _is_timer(name: str) -> bool:
    return name.endswith(("_interval", "_ttl", "_timeout", "_base", "_cap"))


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
        return "empty" if not value else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "unset"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    if isinstance(field.default, float) and field.default.is_integer():
        return f"`{int(field.default)}`"
    return f"`{field.default}`"


def render_environment() -> str:
    from pydantic_settings import BaseSettings

    out = []
    classes = settings_classes()
    for cls in classes:
        inherited: set[str] = set()
        for base in cls.__mro__[1:]:
            if isinstance(base, type) and issubclass(base, BaseSettings):
                inherited |= set(base.model_fields)
        own = [name for name in cls.model_fields if name not in inherited]
        if not own:
            continue
        readers = [c.__name__ for c in classes if issubclass(c, cls) and c is not cls]
        title = f"`{cls.__name__}`"
        doc = _first_paragraph(cls.__doc__)
        also = f" Also read by {', '.join(f'`{r}`' for r in readers)}." if readers else ""
        out.append(f"#### {title}\n\n{doc}{also}\n\n")
        rows = []
        for name in own:
            field = cls.model_fields[name]
            variables = " or ".join(f"`{v}`" for v in setting_variables(cls, name))
            kind = _type_name(name, field.annotation, list(field.metadata))
            rows.append([variables, kind, _default(field), field.description or ""])
        out.append(_table(["variable", "type", "default", "meaning"], rows) + "\n")
    options: dict[str, list[str]] = {}
    meaning: dict[str, str] = {}
    for command, option, variable, help_text in cli_option_variables():
        options.setdefault(variable, []).append(f"`{' '.join(command)} {option}`")
        meaning.setdefault(variable, help_text)
    rows = [[f"`{v}`", ", ".join(options[v]), meaning[v]] for v in options]
    from taskfleet.shared import embedded

    rows.append(
        [
            f"`{embedded.DATADIR_ENV}`",
            "`taskfleet dev` and the test suite",
            "Data directory of the embedded Postgres (default `.taskfleet/pg` in the checkout).",
        ]
    )
    out.append("#### Read by the `taskfleet` command's options\n\n")
    out.append(_table(["variable", "sets", "meaning"], rows))
    return "".join(out)


# --------------------------------------------------------------------------------------------
# CLI


def cli_app() -> Any:
    """The ``taskfleet`` Typer app with every command registered (each module of the CLI
    package registers its commands when imported, as ``taskfleet``'s entry point does)."""
    import taskfleet.cli as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "__main__":
            importlib.import_module(f"{package.__name__}.{module.name}")
    from taskfleet.cli.main import load_commands

    return load_commands()


def cli_commands() -> list[tuple[tuple[str, ...], Callable[..., Any] | None]]:
    """(path, callback) of every command and group, depth first, in registration order."""
    from typer.main import get_command_name

    found: list[tuple[tuple[str, ...], Callable[..., Any] | None]] = []

    def walk(app: Any, path: tuple[str, ...]) -> None:
        for command in app.registered_commands:
            name = command.name or get_command_name(command.callback.__name__)
            found.append(((*path, name), command.callback))
        for group in app.registered_groups:
            name = group.name or group.typer_instance.info.name
            found.append(((*path, name), None))
            walk(group.typer_instance, (*path, name))

    walk(cli_app(), ())
    return found


def cli_option_variables() -> list[tuple[tuple[str, ...], str, str, str]]:
    """(command path, option, variable, help) for every CLI option read from the environment."""
    from typer.models import ArgumentInfo, OptionInfo

    rows = []
    for path, callback in cli_commands():
        if callback is None:
            continue
        hints = typing.get_type_hints(callback, include_extras=True)
        for name, parameter in inspect.signature(callback).parameters.items():
            infos = [parameter.default]
            hint = hints.get(name)
            if typing.get_origin(hint) is typing.Annotated:
                infos += list(typing.get_args(hint)[1:])
            for info in infos:
                if isinstance(info, OptionInfo | ArgumentInfo) and info.envvar:
                    option = (info.param_decls or (f"--{name.replace('_', '-')}",))[0]
                    variables = [info.envvar] if isinstance(info.envvar, str) else info.envvar
                    for variable in variables:
                        rows.append((("taskfleet", *path), option, variable, info.help or ""))
    return rows


def cli_help(path: tuple[str, ...]) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli_app(), [*path, "--help"], prog_name="taskfleet")
    if result.exit_code != 0:
        raise RuntimeError(f"taskfleet {' '.join(path)} --help exited {result.exit_code}")
    lines = [line.rstrip() for line in result.output.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def render_cli() -> str:
    out = [f"```text\n$ taskfleet --help\n{cli_help(())}\n```\n"]
    for path, _callback in cli_commands():
        command = " ".join(path)
        out.append(f"\n##### `taskfleet {command}`\n\n")
        out.append(f"```text\n$ taskfleet {command} --help\n{cli_help(path)}\n```\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Metrics


def metric_registries() -> list[tuple[str, Any]]:
    """(exporter, registry) for every process, filled as that process fills it."""
    from prometheus_client import CollectorRegistry
    from prometheus_fastapi_instrumentator import metrics as instrumentator_metrics

    from taskfleet.shared.metrics import WorkerMetrics

    worker = CollectorRegistry()
    WorkerMetrics.create(worker)
    http = CollectorRegistry()
    instrumentator_metrics.default(registry=http)
    return [
        ("worker", worker),
        ("API", api_app().state.api.metrics_registry),
        ("API (prometheus-fastapi-instrumentator)", http),
    ]


#: The name Prometheus stores, from the name given to prometheus_client.
_STORED_SUFFIX = {"counter": "_total"}


def metric_rows() -> list[tuple[str, str, tuple[str, ...], str, str]]:
    """(stored name, type, labels, exporter, help) of every metric the processes export."""
    rows = []
    for exporter, registry in metric_registries():
        # prometheus_client keeps its collectors in registration order here; the public
        # collect() loses the label names of a labelled metric that has no sample yet.
        for collector in registry._collector_to_names:
            kind = collector._type
            name = collector._name + _STORED_SUFFIX.get(kind, "")
            labels = tuple(collector._labelnames)
            rows.append((name, kind, labels, exporter, collector._documentation))
    return rows


def render_metrics() -> str:
    rows = [
        [f"`{name}`", kind, ", ".join(f"`{label}`" for label in labels), exporter, doc]
        for name, kind, labels, exporter, doc in metric_rows()
    ]
    return _table(["name", "type", "labels", "exported by", "meaning"], rows)


# --------------------------------------------------------------------------------------------
# Python API


def render_python_api() -> str:
    import taskfleet

    rows = []
    for name in taskfleet.__all__:
        value = getattr(taskfleet, name)
        if inspect.isclass(value):
            kind = "exception" if issubclass(value, BaseException) else "class"
        elif callable(value):
            kind = "function"
        else:
            kind = type(value).__name__
        doc = _first_paragraph(inspect.getdoc(value)) if kind != "str" else ""
        if name == "__version__":
            doc = "The installed distribution's version (from `pyproject.toml`)."
        rows.append([f"`taskfleet.{name}`", kind, doc])
    return _table(["name", "kind", "what"], rows)


# --------------------------------------------------------------------------------------------
# Putting it together

RENDERERS: dict[str, Callable[[], str]] = {
    "http-routes": render_http_routes,
    "environment": render_environment,
    "cli": render_cli,
    "metrics": render_metrics,
    "python-api": render_python_api,
}


def render_reference(text: str) -> str:
    """``text`` (docs/reference.md) with every generated block rendered anew."""
    seen: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in RENDERERS:
            raise KeyError(f"docs/reference.md has a generated block nobody renders: {name}")
        seen.add(name)
        return match.group("begin") + RENDERERS[name]() + match.group("end")

    with clean_environment():
        rendered = _BLOCK.sub(replace, text)
    missing = set(RENDERERS) - seen
    if missing:
        raise KeyError(f"docs/reference.md lacks the generated blocks: {sorted(missing)}")
    return rendered


def generated_files() -> dict[Path, str]:
    """Every generated file's path and the content the code gives it now."""
    with clean_environment():
        openapi = openapi_text()
    return {REFERENCE: render_reference(REFERENCE.read_text()), OPENAPI: openapi}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gen-reference", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a generated part drifted"
    )
    args = parser.parse_args(argv)
    drifted = []
    for path, content in generated_files().items():
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        drifted.append(path.relative_to(REPO))
        if not args.check:
            path.write_text(content)
    verb = "out of date" if args.check else "rewritten"
    for path in drifted:
        print(f"{path}: {verb}")
    if not drifted:
        print("the generated reference is up to date")
    return 1 if args.check and drifted else 0


if __name__ == "__main__":
    sys.exit(main())
