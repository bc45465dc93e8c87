"""A handler's signature read at import: its form, its payload type, the call it makes;
and the shape that carries the type to the supervisor, rebuilt to check as it does."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import pytest
from goqueue.actors import ActorDefinitionError, Context, TypedActor, actor
from goqueue.actors.shapes import rebuild, shape_of
from goqueue.actors.typed import Form, PayloadMisfit, check, read

pytestmark = pytest.mark.timeout(10)

CTX = Context("job-1", 1, "t", "default")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Part(msgspec.Struct, tag="part"):
    sku: str


class Kit(msgspec.Struct, tag="kit"):
    parts: list[Part]


class Order(msgspec.Struct, forbid_unknown_fields=True):
    id: uuid.UUID
    at: datetime.datetime
    total: Annotated[int, msgspec.Meta(ge=0)]
    item: Part | Kit
    note: str | None = None
    renamed: int = msgspec.field(default=0, name="re-named")


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Options(TypedDict):
    depth: int


def test_the_classic_form_is_as_before() -> None:
    def plain(payload, ctx): ...
    def mapping(payload: dict[str, Any] | None, ctx: Context): ...
    def anything(payload: Any, ctx): ...

    for fn in (plain, mapping, anything):
        sig = read(fn, "t")
        assert sig.form is Form.CLASSIC and sig.shape() is None and sig.schema() is None
        assert sig.call(lambda p, c: (p, c), b'[1, "x"]', CTX) == ([1, "x"], CTX)


def test_the_struct_form_converts_the_payload_whole() -> None:
    def place(payload: Order, ctx: Context) -> Order: ...
    def at(p: Point) -> None: ...
    def opts(options: Options, *, ctx: Context) -> None: ...

    sig = read(place, "t")
    assert sig.form is Form.STRUCT and sig.result is Order
    raw = b'{"id": "0b7c1c64-5bd8-4f0e-9a39-2bbd9b0a8d11", "at": "2026-01-01T00:00:00Z",'
    raw += b' "total": 3, "item": {"type": "part", "sku": "a"}}'
    order, ctx = sig.call(lambda p, c: (p, c), raw, CTX)
    assert isinstance(order.id, uuid.UUID) and order.item == Part("a") and ctx is CTX
    assert read(at, "t").call(lambda p: p, b'{"x": 1}', CTX) == Point(1, 0)
    assert read(opts, "t").call(lambda o, ctx: (o, ctx), b'{"depth": 2}', CTX) == (
        {"depth": 2},
        CTX,
    )


def test_the_keyword_form_takes_parameters_from_the_payload() -> None:
    def resize(url: str, /, width: int = 100, *, color: Color = Color.RED, ctx: Context):
        return url, width, color, ctx

    sig = read(resize, "resize")
    assert sig.form is Form.KEYWORD and sig.context == "ctx"
    assert sig.call(resize, b'{"url": "u", "color": "blue"}', CTX) == ("u", 100, Color.BLUE, CTX)
    assert sig.bind(("u",), {"width": 3}) == {"url": "u", "width": 3}
    with pytest.raises(TypeError):
        sig.bind((), {"nope": 1})

    def tick(ctx: Context) -> None: ...

    assert read(tick, "tick").call(lambda ctx: ctx, b"null", CTX) is CTX  # null is {}


@pytest.mark.parametrize(
    ("payload", "field", "reason"),
    [
        (b'{"url": 1}', "payload.url", "Expected `str`, got `int`"),
        (b"{}", "payload", "Object missing required field `url`"),
        (b'{"url": "u", "w": 1}', "payload", "Object contains unknown field `w`"),
        (b'{"url": "u", "color": "green"}', "payload.color", "Invalid enum value 'green'"),
        (b"[]", "payload", "Expected `object`, got `array`"),
    ],
)
def test_a_misfit_names_the_field(payload: bytes, field: str, reason: str) -> None:
    def resize(url: str, color: Color = Color.RED) -> None: ...

    sig = read(resize, "resize")
    with pytest.raises(PayloadMisfit) as err:
        sig.call(resize, payload, CTX)
    assert (err.value.field, err.value.reason) == (field, reason)
    assert str(err.value) == f"{field}: {reason}"


def test_signatures_no_form_fits_fail_at_import() -> None:
    with pytest.raises(ActorDefinitionError, match=r"\*args has no place"):

        @actor("v")
        def variadic(*args: int) -> None: ...

    with pytest.raises(ActorDefinitionError, match="cannot resolve"):

        @actor("u")
        def unknown(x: Undefined) -> None: ...  # type: ignore[name-defined]  # noqa: F821


def test_the_decorator_makes_a_typed_actor_for_the_keyword_form() -> None:
    @actor("resize")
    def resize(ctx: Context, url: str, width: int = 1) -> None: ...

    @actor("classic")
    def classic(payload, ctx): ...

    assert isinstance(resize, TypedActor) and not isinstance(classic, TypedActor)
    assert resize.payload(("u",), {}) == {"url": "u"}
    assert classic.payload(({"a": 1},), {}) == {"a": 1}
    info = resize.info()
    assert info.keyword and info.shape is not None and info.schema is not None
    assert classic.info().shape is None


@pytest.mark.parametrize(
    "tp",
    [
        Order,
        Point,
        Options,
        list[Annotated[str, msgspec.Meta(min_length=2)]],
        dict[int, datetime.date],
        tuple[int, str],
        Literal["a", 1] | None,
        set[uuid.UUID],
        decimal.Decimal,
        datetime.timedelta,
        Annotated[datetime.datetime, msgspec.Meta(tz=True)],
        bytes,
        Annotated[float, msgspec.Meta(gt=0, le=1)],
    ],
)
def test_a_rebuilt_shape_accepts_and_refuses_as_the_type_does(tp: Any) -> None:
    rebuilt = msgspec.json.Decoder(rebuild(shape_of(tp)))
    original = msgspec.json.Decoder(tp)
    samples = [
        b'{"id": "0b7c1c64-5bd8-4f0e-9a39-2bbd9b0a8d11", "at": "2026-01-01T00:00:00Z",'
        b' "total": 3, "item": {"type": "kit", "parts": [{"type": "part", "sku": "a"}]}}',
        b'{"id": "x", "at": "2026-01-01T00:00:00Z", "total": -1, "item": {}}',
        b'{"id": "0b7c1c64-5bd8-4f0e-9a39-2bbd9b0a8d11", "at": "2026", "total": 1,'
        b' "item": {"type": "part", "sku": "a"}, "extra": 1}',
        b'{"x": 1}',
        b'{"x": "1"}',
        b'{"depth": 1}',
        b'["ab", "c"]',
        b'{"1": "2026-01-01"}',
        b'{"a": "2026-01-01"}',
        b'[1, "a"]',
        b'"a"',
        b"1",
        b"null",
        b'["0b7c1c64-5bd8-4f0e-9a39-2bbd9b0a8d11"]',
        b'"1.5"',
        b'"P1D"',
        b'"2026-01-01T00:00:00"',
        b'"2026-01-01T00:00:00Z"',
        b'"aGk="',
        b"0.5",
        b"0",
    ]
    for sample in samples:
        expected = _outcome(original, sample)
        assert _outcome(rebuilt, sample) == expected, (tp, sample)


def _outcome(decoder: msgspec.json.Decoder[Any], raw: bytes) -> str:
    try:
        check(decoder, raw, keyword=False)
    except PayloadMisfit as exc:
        return f"misfit at {exc.field}"
    return "fits"
