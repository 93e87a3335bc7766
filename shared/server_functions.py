"""Installing the server-side functions of :data:`taskfleet.shared.queries.SERVER_FUNCTIONS`
(``taskfleet migrate`` does it, after the migrations, in their transaction).

Each function's parameter and result types are the ones the server reports for the statement
itself (a describe), so the function and the statement cannot disagree; its comment carries a
digest of its CREATE statement. A function present with that digest is left alone (at head,
``taskfleet migrate`` creates nothing); one with another digest (a migration changed a column
it returns) is dropped and created again.
"""

from __future__ import annotations

import uuid

import asyncpg

from taskfleet.shared import queries


async def _type_name(conn: asyncpg.Connection, oid: int) -> str:
    sql, args = queries.type_name.positional({"oid": oid})
    name: str = await conn.fetchval(sql, *args)
    return name


async def _stamp(conn: asyncpg.Connection, query: queries.Query) -> str | None:
    """The stamp (a digest of its CREATE statement) of ``query``'s function; None when there is
    no such function."""
    sql, args = queries.server_function_stamp.positional(
        {"name": queries.server_function_name(query)}
    )
    row = await conn.fetchrow(sql, *args)
    if row is None or not row["present"]:
        return None
    return str(row["stamp"] or "")


async def install(conn: asyncpg.Connection) -> list[str]:
    """Create the functions missing on ``conn``'s database, and re-create those whose types no
    longer match what the server reports for their statement (a migration changed a column they
    return), in the caller's transaction; the names created."""
    created = []
    for query in queries.SERVER_FUNCTIONS:
        sql, _ = query.positional({name: None for name in query.params})
        # A name no other client can have left prepared on a pooler's server connection.
        statement = await conn.prepare(sql, name=f"__taskfleet_describe_{uuid.uuid4().hex}__")
        param_types = [await _type_name(conn, t.oid) for t in statement.get_parameters()]
        columns = [(a.name, await _type_name(conn, a.type.oid)) for a in statement.get_attributes()]
        create = queries.server_function_create(query, param_types, columns)
        stamp = queries.server_function_stamp_of(create)
        found = await _stamp(conn, query)
        if found == stamp:
            continue
        if found is not None:
            await conn.execute(queries.server_function_drop(query))
        await conn.execute(create)
        await conn.execute(queries.server_function_comment(query, stamp))
        created.append(queries.server_function_name(query))
    return created
