"""Installing the server-side functions of :data:`taskfleet.shared.queries.SERVER_FUNCTIONS`
(``taskfleet migrate`` does it, after the migrations, in their transaction).

Each function's parameter and result types are the ones the server reports for the statement
itself (a describe), so the function and the statement cannot disagree. A function already
present is left alone: at head, ``taskfleet migrate`` creates nothing.
"""

from __future__ import annotations

import uuid

import asyncpg

from taskfleet.shared import queries


async def _type_name(conn: asyncpg.Connection, oid: int) -> str:
    sql, args = queries.type_name.positional({"oid": oid})
    name: str = await conn.fetchval(sql, *args)
    return name


async def _present(conn: asyncpg.Connection, query: queries.Query) -> bool:
    sql, args = queries.server_function_exists.positional(
        {"name": queries.server_function_name(query)}
    )
    return bool(await conn.fetchval(sql, *args))


async def install(conn: asyncpg.Connection) -> list[str]:
    """Create the functions missing on ``conn``'s database (in the caller's transaction); the
    names created."""
    created = []
    for query in queries.SERVER_FUNCTIONS:
        if await _present(conn, query):
            continue
        sql, _ = query.positional({name: None for name in query.params})
        # A name no other client can have left prepared on a pooler's server connection.
        statement = await conn.prepare(sql, name=f"__taskfleet_describe_{uuid.uuid4().hex}__")
        param_types = [await _type_name(conn, t.oid) for t in statement.get_parameters()]
        columns = [(a.name, await _type_name(conn, a.type.oid)) for a in statement.get_attributes()]
        await conn.execute(queries.server_function_create(query, param_types, columns))
        created.append(queries.server_function_name(query))
    return created
