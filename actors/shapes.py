"""A typed actor's payload type, carried from a worker to its supervisor.

The worker builds a msgspec type from a handler's signature (`typed.py`); the supervisor
checks payloads at enqueue against the same type, without importing the user's modules
(they may be heavy, and a reload could not re-import them). So the type travels as a
*shape*: msgspec's own description of it (`msgspec.inspect`), written as JSON, from
which the supervisor rebuilds an equivalent type. JSON Schema is not used for this: it
loses what the check needs (msgspec writes a `datetime` as a bare string, for one).

Only what decoding JSON depends on is kept (field names and whether they are required,
tags, constraints); classes become Structs and enums become Literals of their values.
What has no JSON form to check (a custom type, a cycle) rebuilds as `Any`: the worker,
which decodes with the real type, still refuses it.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Annotated, Any, Literal, Union

import msgspec
import msgspec.inspect as mi

Shape = dict[str, Any]

_SCALARS: dict[type[mi.Type], str] = {
    mi.AnyType: "any",
    mi.NoneType: "null",
    mi.BoolType: "bool",
    mi.DateType: "date",
    mi.TimeDeltaType: "timedelta",
    mi.UUIDType: "uuid",
    mi.DecimalType: "decimal",
}
_BUILT: dict[str, Any] = {
    "any": Any,
    "null": None,
    "bool": bool,
    "date": datetime.date,
    "timedelta": datetime.timedelta,
    "uuid": uuid.UUID,
    "decimal": decimal.Decimal,
}
_CONSTRAINTS = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "pattern")
_SEQUENCES: dict[type[mi.Type], str] = {
    mi.ListType: "list",
    mi.SetType: "list",
    mi.FrozenSetType: "list",
    mi.VarTupleType: "list",
}


def shape_of(tp: Any) -> bytes:
    """The shape of `tp`, as JSON."""
    return msgspec.json.encode(_describe(mi.type_info(tp), set()))


def rebuild(shape: bytes) -> Any:
    """A type that decodes JSON as the type `shape` describes does."""
    return _build(msgspec.json.decode(shape))


def _limits(t: mi.Type) -> dict[str, Any]:
    return {k: getattr(t, k) for k in _CONSTRAINTS if getattr(t, k, None) is not None}


def _describe(t: mi.Type, seen: set[int]) -> Shape:
    kind = _SCALARS.get(type(t))
    if kind is not None:
        return {"k": kind}
    match t:
        case mi.Metadata():
            return _describe(t.type, seen)
        case mi.IntType() | mi.FloatType() | mi.StrType() | mi.BytesType() | mi.ByteArrayType():
            name = type(t).__name__.removesuffix("Type").lower()
            return {"k": "bytes" if name == "bytearray" else name, **_limits(t)}
        case mi.DateTimeType() | mi.TimeType():
            return {"k": "datetime" if isinstance(t, mi.DateTimeType) else "time", "tz": t.tz}
        case mi.EnumType():
            return {"k": "literal", "values": [m.value for m in t.cls]}
        case mi.LiteralType():
            return {"k": "literal", "values": list(t.values)}
        case mi.UnionType():
            return {"k": "union", "of": [_describe(x, seen) for x in t.types]}
        case mi.ListType() | mi.SetType() | mi.FrozenSetType() | mi.VarTupleType():
            return {"k": "list", "item": _describe(t.item_type, seen), **_limits(t)}
        case mi.TupleType():
            return {"k": "tuple", "items": [_describe(x, seen) for x in t.item_types]}
        case mi.DictType():
            key, value = _describe(t.key_type, seen), _describe(t.value_type, seen)
            return {"k": "dict", "key": key, "value": value, **_limits(t)}
        case mi.StructType() | mi.DataclassType() | mi.TypedDictType() | mi.NamedTupleType():
            return _describe_object(t, seen)
    return {"k": "any"}  # custom, ext, raw: nothing a JSON check can hold


def _describe_object(
    t: mi.StructType | mi.DataclassType | mi.TypedDictType | mi.NamedTupleType, seen: set[int]
) -> Shape:
    if id(t.cls) in seen:
        return {"k": "any"}  # a recursive type: its inner levels are the worker's to check
    seen = seen | {id(t.cls)}
    fields = [
        {"name": f.encode_name, "type": _describe(f.type, seen), "required": f.required}
        for f in t.fields
    ]
    shape: Shape = {"k": "object", "name": t.cls.__name__, "fields": fields}
    if isinstance(t, mi.StructType):
        shape.update(
            tag_field=t.tag_field,
            tag=t.tag,
            array_like=t.array_like,
            forbid=t.forbid_unknown_fields,
        )
    elif isinstance(t, mi.NamedTupleType):
        shape["array_like"] = True
    return shape


def _build(shape: Shape) -> Any:
    kind = shape["k"]
    if kind in _BUILT:
        return _BUILT[kind]
    limits = {k: shape[k] for k in _CONSTRAINTS if k in shape}
    match kind:
        case "int" | "float" | "str" | "bytes":
            base = {"int": int, "float": float, "str": str, "bytes": bytes}[kind]
            return Annotated[base, msgspec.Meta(**limits)] if limits else base
        case "datetime" | "time":
            base = datetime.datetime if kind == "datetime" else datetime.time
            return base if shape["tz"] is None else Annotated[base, msgspec.Meta(tz=shape["tz"])]
        case "literal":
            return Literal[tuple(shape["values"])]
        case "union":
            return Union[tuple(_build(s) for s in shape["of"])]  # noqa: UP007 - built at run time
        case "list":
            built = list.__class_getitem__(_build(shape["item"]))
            return Annotated[built, msgspec.Meta(**limits)] if limits else built
        case "tuple":
            return tuple.__class_getitem__(tuple(_build(s) for s in shape["items"]))
        case "dict":
            built = dict.__class_getitem__((_build(shape["key"]), _build(shape["value"])))
            return Annotated[built, msgspec.Meta(**limits)] if limits else built
        case "object":
            return _build_object(shape)
    return Any


def _build_object(shape: Shape) -> Any:
    """A Struct with the fields' encoded names (renamed from `f0`, `f1`...: an encoded name
    need not be an identifier). A field not required defaults to None: the check decodes
    only to see that the payload fits, and never keeps the value."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    rename: dict[str, str] = {}
    for i, f in enumerate(shape["fields"]):
        name = f"f{i}"
        rename[name] = f["name"]
        built = _build(f["type"])
        fields.append((name, built) if f["required"] else (name, built, None))
    return msgspec.defstruct(
        shape["name"],
        fields,
        kw_only=True,
        rename=rename,
        tag_field=shape.get("tag_field"),
        tag=shape.get("tag"),
        array_like=shape.get("array_like", False),
        forbid_unknown_fields=shape.get("forbid", False),
    )
