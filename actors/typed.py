"""A handler's signature, read once at import: which of the three forms it has, the msgspec
type of its payload, and how a decoded payload becomes the call.

- Keyword form, `def resize(url: str, width: int = 100, *, ctx: Context)`: the payload
  is an object whose fields are the handler's parameters, each converted to its
  annotation, defaults applying; the parameter annotated `Context` (or named `ctx`)
  gets the context.
- Struct form, `def f(payload: Order, ctx)`: one parameter besides the context, annotated
  with a Struct, dataclass or TypedDict (or any type, when it is named `payload`); the
  payload is converted to it whole.
- Classic form, `def f(payload, ctx)` with the payload unannotated, `Any`, `object`, or a
  dict or mapping: the decoded JSON, as before typed actors.

The same type checks a payload at enqueue in the supervisor (`shapes.py` carries it
there) and converts it in the worker, so a payload that was let in fits.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import msgspec
from goqueue.actors.errors import ActorDefinitionError
from goqueue.actors.job_context import Context
from goqueue.actors.shapes import shape_of

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_AT = re.compile(r"^(?P<text>.*) - at `\$(?P<path>.*)`$", re.DOTALL)
_UNTYPED = (Any, object, dict, Mapping, collections.abc.MutableMapping, typing.Dict)  # noqa: UP006
_NULL = b"null"


class Form(StrEnum):
    """How a handler takes its payload."""

    KEYWORD = "keyword"
    STRUCT = "struct"
    CLASSIC = "classic"


class PayloadMisfit(ValueError):
    """A payload that does not fit its job type; `field` names where (`payload.width`)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def misfit(exc: msgspec.ValidationError, prefix: str = "payload") -> PayloadMisfit:
    """msgspec's error, with its path (`$.width`) rooted at `prefix` (`payload.width`)."""
    text = str(exc)
    found = _AT.match(text)
    if found is None:
        return PayloadMisfit(text, prefix)
    return PayloadMisfit(found["text"], prefix + found["path"])


def check(decoder: msgspec.json.Decoder[Any], payload: bytes, keyword: bool) -> Any:
    """`payload` (JSON) decoded to the type, or PayloadMisfit. A keyword-form payload that
    is null (or left out) is an empty object: the handler's defaults apply."""
    if keyword and payload == _NULL:
        payload = b"{}"
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise misfit(exc) from None


@dataclasses.dataclass(frozen=True, slots=True)
class Signature:
    """What a handler's signature says about its payload and its result."""

    form: Form
    payload: Any = None  # the payload's msgspec type (None in the classic form)
    positional: tuple[str, ...] = ()  # keyword form: fields passed by position, in order
    keywords: tuple[str, ...] = ()  # keyword form: fields passed by name
    context: str | None = None  # the parameter that gets the context
    context_positional: bool = True  # the context goes by position (classic, struct form)
    result: Any = None  # the return annotation results are encoded as (None: as returned)
    send: inspect.Signature | None = None  # keyword form: what `.send` binds its arguments to
    decoder: msgspec.json.Decoder[Any] | None = dataclasses.field(default=None, compare=False)

    @property
    def keyword(self) -> bool:
        """The keyword form: a null payload stands for `{}`."""
        return self.form is Form.KEYWORD

    def shape(self) -> bytes | None:
        """The payload type's shape, for the supervisor's check (None: classic)."""
        return None if self.payload is None else shape_of(self.payload)

    def schema(self) -> dict[str, Any] | None:
        """The payload's JSON Schema, for /openapi.json and the dashboard (None: classic,
        or a type msgspec cannot describe)."""
        if self.payload is None:
            return None
        try:
            return msgspec.json.schema(self.payload)
        except (TypeError, ValueError):
            return None

    def call(self, fn: Callable[..., Any], payload: bytes, ctx: Context) -> Any:
        """Call `fn` with `payload` (JSON) converted as its signature says (PayloadMisfit
        when it does not fit)."""
        if self.decoder is None:
            return fn(msgspec.json.decode(payload), ctx)
        value = check(self.decoder, payload, self.keyword)
        if self.form is Form.STRUCT:
            if self.context is None:
                return fn(value)
            if self.context_positional:
                return fn(value, ctx)
            return fn(value, **{self.context: ctx})
        args = [getattr(value, name) for name in self.positional]
        kwargs = {name: getattr(value, name) for name in self.keywords}
        if self.context is not None:
            kwargs[self.context] = ctx
        return fn(*args, **kwargs)

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A keyword-form payload from the handler's own arguments (TypeError as a call
        would raise); the ones left out take their defaults where the job runs."""
        assert self.send is not None
        return dict(self.send.bind(*args, **kwargs).arguments)


def read(fn: Callable[..., Any], name: str) -> Signature:
    """The form of `fn`'s signature and the types it implies. Raises ActorDefinitionError
    for a signature no form fits, or annotations that cannot be resolved or converted."""
    label = f"@actor({name!r})"
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a NameError, mostly: a name the module does not define
        raise ActorDefinitionError(
            f"{label}: cannot resolve the handler's annotations: {exc}"
        ) from None
    params = list(inspect.signature(fn).parameters.values())
    result = _result_type(hints.get("return", inspect.Signature.empty))
    if _classic(params, hints):
        return Signature(Form.CLASSIC, context=params[1].name)  # exactly as before: as returned
    context = [p for p in params if p.name == "ctx" or hints.get(p.name) is Context]
    if len(context) > 1:
        raise ActorDefinitionError(f"{label}: more than one parameter takes the context")
    ctx = context[0] if context else None
    rest = [p for p in params if p is not ctx]
    variadic = [p.name for p in rest if p.kind in _VARIADIC]
    if variadic:
        raise ActorDefinitionError(
            f"{label}: *{variadic[0]} has no place in a job's payload; name each argument"
        )
    if len(rest) == 1 and _whole(rest[0], hints):
        return _struct_form(label, rest[0], hints, ctx, result)
    return _keyword_form(label, name, rest, hints, ctx, result)


def _classic(params: list[inspect.Parameter], hints: Mapping[str, Any]) -> bool:
    """`(payload, ctx)`, the payload untyped, any mapping, or optional."""
    if len(params) != 2 or any(p.kind not in _POSITIONAL for p in params):
        return False
    if hints.get(params[1].name, Context) is not Context:
        return False
    hint = hints.get(params[0].name, Any)
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    return all(o is type(None) or (typing.get_origin(o) or o) in _UNTYPED for o in options)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _whole(param: inspect.Parameter, hints: Mapping[str, Any]) -> bool:
    """A parameter the payload is converted to whole (the struct form)."""
    hint = hints.get(param.name)
    if hint is None:
        return False
    if param.name == "payload":
        return True
    return isinstance(hint, type) and (
        issubclass(hint, msgspec.Struct)
        or dataclasses.is_dataclass(hint)
        or typing.is_typeddict(hint)
    )


def _struct_form(
    label: str,
    param: inspect.Parameter,
    hints: Mapping[str, Any],
    ctx: inspect.Parameter | None,
    result: Any,
) -> Signature:
    payload = hints[param.name]
    return Signature(
        Form.STRUCT,
        payload=payload,
        context=None if ctx is None else ctx.name,
        context_positional=ctx is not None and ctx.kind in _POSITIONAL,
        result=result,
        decoder=_decoder(label, payload),
    )


def _keyword_form(
    label: str,
    name: str,
    params: list[inspect.Parameter],
    hints: Mapping[str, Any],
    ctx: inspect.Parameter | None,
    result: Any,
) -> Signature:
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for p in params:
        hint = hints.get(p.name, Any)
        if p.default is inspect.Parameter.empty:
            fields.append((p.name, hint))
        else:
            fields.append((p.name, hint, _default(p.default)))
    try:
        payload = msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True)
    except (TypeError, ValueError) as exc:
        raise ActorDefinitionError(
            f"{label}: the parameters cannot form a payload: {exc}"
        ) from None
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY)
    return Signature(
        Form.KEYWORD,
        payload=payload,
        positional=positional,
        keywords=tuple(p.name for p in params if p.name not in positional),
        context=None if ctx is None else ctx.name,
        context_positional=False,
        result=result,
        send=inspect.Signature(params),
        decoder=_decoder(label, payload),
    )


def _default(value: Any) -> Any:
    """A parameter's default as a Struct field's (msgspec copies only empty mutables)."""
    if isinstance(value, list | dict | set | bytearray) and value:
        return msgspec.field(default_factory=lambda: copy.deepcopy(value))
    return value


def _decoder(label: str, payload: Any) -> msgspec.json.Decoder[Any]:
    try:
        decoder = msgspec.json.Decoder(payload)
        shape_of(payload)
    except (TypeError, ValueError) as exc:
        raise ActorDefinitionError(
            f"{label}: msgspec cannot decode a payload as typed: {exc}"
        ) from None
    return decoder


def _result_type(hint: Any) -> Any:
    """The return annotation results are converted to, or None where conversion is moot."""
    if hint is inspect.Signature.empty or hint is None or hint is type(None) or hint in _UNTYPED:
        return None
    try:
        msgspec.json.Encoder().encode(None)
        msgspec.inspect.type_info(hint)
    except (TypeError, ValueError):
        return None
    return hint
