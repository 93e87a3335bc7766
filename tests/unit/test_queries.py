"""Named SQL statements: unique names and the ``:name`` -> ``$n`` (asyncpg) and ``%s``
(psycopg) conversions."""

from __future__ import annotations

import re

import asyncpg
import pytest

import taskfleet.shared.queries as queries_module
from taskfleet.shared import db
from taskfleet.shared.queries import QUERIES, Query, _query

_LEFTOVER_PARAM = re.compile(r"(?<![:\w]):[A-Za-z_]")


def test_positional_numbers_parameters_in_order_of_first_use() -> None:
    query = Query("t", "SELECT :b, :a, :b WHERE x = :c")
    sql, args = query.positional({"a": 1, "b": 2, "c": 3})
    assert sql == "SELECT $1, $2, $1 WHERE x = $3"
    assert args == [2, 1, 3]
    assert query.params == ("b", "a", "c")


def test_positional_leaves_casts_alone() -> None:
    query = Query("t", "SELECT :id::bigint, now()::date, '{}'::jsonb, x::text[] FROM t")
    sql, args = query.positional({"id": 5})
    assert sql == "SELECT $1::bigint, now()::date, '{}'::jsonb, x::text[] FROM t"
    assert args == [5]


def test_positional_leaves_cast_function_form_and_arrays_alone() -> None:
    query = Query("t", "SELECT CAST(:ids AS bigint[]), arr[1:2], :n_2 + 1")
    sql, args = query.positional({"ids": [1], "n_2": 4})
    assert sql == "SELECT CAST($1 AS bigint[]), arr[1:2], $2 + 1"
    assert args == [[1], 4]


def test_positional_without_parameters() -> None:
    query = Query("t", "SELECT 1::int")
    assert query.positional({}) == ("SELECT 1::int", [])
    assert query.params == ()


def test_positional_reports_missing_parameters() -> None:
    query = Query("t", "SELECT :a, :b")
    with pytest.raises(KeyError, match="b"):
        query.positional({"a": 1})


def test_positional_ignores_extra_parameters() -> None:
    assert Query("t", "SELECT :a").positional({"a": 1, "z": 2}) == ("SELECT $1", [1])


def test_formatted_passes_each_use_of_a_parameter_and_doubles_literal_percent() -> None:
    query = Query("t", "SELECT :b, :a::int, :b WHERE x LIKE 'a%' AND y = CAST(:c AS text[])")
    sql, args = query.formatted({"a": 1, "b": 2, "c": ["x"], "unused": 0})
    assert sql == "SELECT %s, %s::int, %s WHERE x LIKE 'a%%' AND y = CAST(%s AS text[])"
    assert args == [2, 1, 2, ["x"]]
    with pytest.raises(KeyError, match="c"):
        query.formatted({"a": 1, "b": 2})


def test_every_query_converts_to_psycopg_form_completely() -> None:
    # Every placeholder is a %s, every other % is doubled, and no :name is left.
    for query in QUERIES.values():
        sql, args = query.formatted({name: None for name in query.params})
        assert not _LEFTOVER_PARAM.search(sql), query.name
        assert sql.count("%s") == len(args), query.name
        assert "%" not in sql.replace("%%", "").replace("%s", ""), query.name


def test_query_names_are_unique_and_match_the_registry_keys() -> None:
    assert QUERIES
    assert all(name == query.name for name, query in QUERIES.items())
    names = [q.name for q in vars(queries_module).values() if isinstance(q, Query)]
    assert len(names) == len(set(names))
    assert set(names) == set(QUERIES)


def test_each_query_is_bound_to_a_module_name_equal_to_its_name() -> None:
    for attr, value in vars(queries_module).items():
        if isinstance(value, Query):
            assert value.name == attr


def test_registering_a_duplicate_name_is_refused() -> None:
    before = dict(QUERIES)
    with pytest.raises(ValueError, match="duplicate"):
        _query("task_get", "SELECT 1")
    assert before == QUERIES


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_converts_to_asyncpg_form(name: str) -> None:
    query = QUERIES[name]
    assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name), "snake_case names"
    sql, args = query.positional({p: index for index, p in enumerate(query.params)})
    assert args == list(range(len(query.params)))
    assert len(set(query.params)) == len(query.params)
    numbers = {int(n) for n in re.findall(r"\$(\d+)", sql)}
    assert numbers == set(range(1, len(query.params) + 1))
    assert not _LEFTOVER_PARAM.search(sql), "a :name parameter was left unconverted"
    assert sql.count("::") == query.sql.count("::")


def test_expected_queries_exist() -> None:
    for name in (
        "task_claim",
        "task_finish_batch",
        "worker_tick",
        "runtime_config_latest",
        "runtime_config_insert",
    ):
        assert name in QUERIES


def test_a_pooled_transaction_sets_the_session_settings_locally() -> None:
    settings = db.session_settings(synchronous_commit=False, statement_timeout=2.5)
    assert queries_module.transaction_begin(settings) == (
        "BEGIN; SET LOCAL statement_timeout = '2500'; SET LOCAL synchronous_commit = 'off'"
    )
    assert queries_module.transaction_begin(db.session_settings()) == "BEGIN"
    assert db.session_settings(generic_plans=True) == {
        "plan_cache_mode": "force_generic_plan",
        "enable_seqscan": "off",
        "jit": "off",
    }
    with pytest.raises(ValueError, match="not a setting name"):
        queries_module.transaction_begin({"x; DROP TABLE t": "1"})


def test_a_pooler_refusing_startup_parameters_is_named() -> None:
    refusal = asyncpg.ProtocolViolationError("unsupported startup parameter: synchronous_commit")
    message = db.pooler_refusal(refusal)
    assert message is not None and "TASKFLEET_DATABASE_POOLER=transaction" in message
    assert db.pooler_refusal(asyncpg.ProtocolViolationError("something else")) is None
    assert db.pooler_refusal(OSError("refused")) is None
