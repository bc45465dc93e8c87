"""A webhook's body, encoded by PostgreSQL in the terminal status's own statement.

The outbox row is written in the same statement as the status, so its body is built
there too: `body_sql(row)` is one SQL expression turning a `jobs` row into the JSON the
API shows for it (`webhooks.job_body`, which the in-memory store uses): the same fields
in the same order (every `Job` field but `seq`), user JSON (payload, result, templates)
byte for byte, times as RFC 3339 in UTC with a `Z`, as msgspec writes them. It is
generated from the `Job` struct, so a new field is encoded (or refused here, at import,
if its kind is new) without anyone remembering to.
"""

from __future__ import annotations

import msgspec
from goqueue.supervisor.common.jobs import SHOWN_FIELDS, Job

# `to_char` patterns: msgspec writes microseconds only when there are some.
_WHOLE = """'YYYY-MM-DD"T"HH24:MI:SS"Z"'"""
_FRACTION = """'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"""

_SCALARS = (
    msgspec.inspect.StrType,
    msgspec.inspect.IntType,
    msgspec.inspect.FloatType,
    msgspec.inspect.BoolType,
    msgspec.inspect.EnumType,
)
_JSON_COLUMNS = (msgspec.inspect.RawType, msgspec.inspect.StructType)  # stored as json


def _time(value: str) -> str:
    """A timestamptz as the JSON string msgspec writes (NULL stays NULL)."""
    pattern = (
        f"CASE WHEN date_trunc('second', {value}) = {value} THEN {_WHOLE} ELSE {_FRACTION} END"
    )
    return f"to_json(to_char({value} AT TIME ZONE 'UTC', {pattern}))::text"


def _errors(value: str) -> str:
    """The errors array (jsonb: {attempt, error, at}) as the API writes it."""
    item = (
        """'{"attempt":' || (e.v -> 'attempt')::text || ',"error":' || (e.v -> 'error')::text"""
        f""" || ',"at":' || {_time("(e.v ->> 'at')::timestamptz")} || '}}'"""
    )
    return (
        f"(SELECT coalesce('[' || string_agg({item}, ',' ORDER BY e.n) || ']', '[]')"
        f" FROM jsonb_array_elements({value}) WITH ORDINALITY AS e(v, n))"
    )


def _value(value: str, kind: msgspec.inspect.Type) -> str:
    """The JSON text of one column, never NULL (`null` instead)."""
    kinds = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
    kinds = tuple(k for k in kinds if not isinstance(k, msgspec.inspect.NoneType))
    if all(isinstance(k, msgspec.inspect.DateTimeType) for k in kinds):
        text = _time(value)
    elif all(isinstance(k, _JSON_COLUMNS) for k in kinds):
        text = f"{value}::text"
    elif all(isinstance(k, msgspec.inspect.VarTupleType) for k in kinds):
        text = _errors(value)
    elif all(isinstance(k, msgspec.inspect.ListType) for k in kinds):
        text = f"to_json({value})::text"  # a workflow step's parent ids (uuid[])
    elif all(isinstance(k, _SCALARS) for k in kinds):
        text = f"to_json({value})::text"
    else:
        raise TypeError(f"no webhook body encoding for a Job field of kind {kinds}")
    return f"coalesce({text}, 'null')"


def body_sql(row: str) -> str:
    """The body of the job in `row` (an expression of the `jobs` row type), as text."""
    kinds = {f.name: f.type for f in msgspec.inspect.type_info(Job).fields}  # type: ignore[attr-defined]
    parts = [
        f"""'{"," if i else "{"}"{name}":' || {_value(f"({row}).{name}", kinds[name])}"""
        for i, name in enumerate(SHOWN_FIELDS)
    ]
    return "\n                || ".join([*parts, "'}'"])
