"""Text a request carries, held to strict rules before anything reads it further.

Invalid UTF-8 is refused at the door, wherever it hides: a JSON body's strings and keys
(msgspec checks typed fields but passes `payload`, kept raw, through unchecked, and
PostgreSQL then refuses it with a driver error), query parameters (yarl would quietly
turn a bad byte into U+FFFD) and header values (aiohttp keeps a bad byte as a lone
surrogate, which cannot be encoded later). Each refusal is a 400 naming the field, the
parameter or the header.

NUL characters: a payload is any JSON and is stored and answered as sent, escaped NULs
(`\\u0000`) included, on both stores. Where a NUL could not be stored faithfully it is
refused: in `dedupe_key` (PostgreSQL text cannot hold one), and with every other control
character in `webhook_url`, `Idempotency-Key` and query parameters. `type` and `queue`
allow none by their pattern.
"""

from __future__ import annotations

import hashlib
from urllib.parse import unquote_to_bytes

import msgspec
from goqueue.api.http.replies import bad_request
from goqueue.supervisor.common.jobs import JobSpec

MAX_LOCATE_DEPTH = 32  # nesting the locator walks into before it names the enclosing field
_CONTAINER = msgspec.json.Decoder(dict[str, msgspec.Raw] | list[msgspec.Raw])
_ANY = msgspec.json.Decoder()
_canonical = msgspec.json.Encoder(order="sorted").encode
_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))


def is_utf8(data: bytes | memoryview) -> bool:
    """True when `data` is valid UTF-8 (C speed)."""
    return _utf8_error(data) is None


def _utf8_error(data: bytes | memoryview) -> int | None:
    """The offset of the first invalid UTF-8 byte, or None."""
    try:
        str(data, "utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return None


def check_utf8(body: bytes, prefix: str = "") -> None:
    """Refuse a body that is not valid UTF-8, naming the field that holds the bad bytes."""
    offset = _utf8_error(body)
    if offset is None:
        return
    field = prefix + locate_invalid_utf8(body)
    if not field:
        raise bad_request(f"request body is not valid JSON: invalid UTF-8 at byte {offset}")
    raise bad_request(
        f"invalid UTF-8 in {field!r}: JSON text must be UTF-8 (byte {offset})", field=field
    )


def locate_invalid_utf8(doc: bytes) -> str:
    """The path (`payload.items[2].name`) of the value or key holding invalid UTF-8 in a
    JSON document known to hold some; "" when it is the document itself.

    Each level is decoded by msgspec as containers of raw values (C speed), and only the
    one child that fails is descended into, so the cost is the document's size times its
    depth, capped at `MAX_LOCATE_DEPTH`."""
    path = ""
    for _ in range(MAX_LOCATE_DEPTH):
        try:
            node = _CONTAINER.decode(doc)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return path  # a string, or a key of this object: this is the field
        step = _bad_child(node)
        if step is None:
            return path
        name, doc = step
        path = f"{path}[{name}]" if isinstance(name, int) else _join(path, name)
    return path


def _bad_child(node: dict[str, msgspec.Raw] | list[msgspec.Raw]) -> tuple[str | int, bytes] | None:
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for name, raw in items:
        data = bytes(raw)
        if not is_utf8(data):
            return name, data
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def check_spec_text(spec: JobSpec, prefix: str = "") -> None:
    """A job's dedupe key holds no NUL and its webhook URL no control character (templates
    included): PostgreSQL text cannot hold a NUL, and no URL needs a control character."""
    if spec.dedupe_key is not None and "\x00" in spec.dedupe_key:
        raise bad_request("dedupe_key must not contain NUL characters", field=f"{prefix}dedupe_key")
    if spec.webhook_url is not None and has_control(spec.webhook_url):
        raise bad_request(
            "webhook_url must not contain control characters", field=f"{prefix}webhook_url"
        )
    for name, template in (("on_success", spec.on_success), ("on_failure", spec.on_failure)):
        if template is not None:
            check_spec_text(template, f"{prefix}{name}.")


def has_control(text: str) -> bool:
    """True when `text` holds a C0 control character or DEL."""
    return not _CONTROL.isdisjoint(text)


def header_text(name: str, value: str) -> str:
    """A header value that is valid UTF-8 and holds no control characters; 400 otherwise
    (aiohttp keeps undecodable bytes as lone surrogates, which cannot be stored)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{name} is not valid UTF-8", header=name) from None
    if has_control(value):
        raise bad_request(f"{name} must not contain control characters", header=name)
    return value


def check_raw_query(raw_query: str) -> None:
    """Every name and value of a raw (still percent-encoded) query string must decode as
    UTF-8 and hold no control characters; 400 naming the parameter otherwise."""
    for part in raw_query.split("&"):
        if not part:
            continue
        raw_name, _, raw_value = part.partition("=")
        name_bytes = unquote_to_bytes(raw_name.replace("+", " "))
        name = name_bytes.decode("utf-8", "backslashreplace")[:50]
        for piece in (name_bytes, unquote_to_bytes(raw_value.replace("+", " "))):
            if not is_utf8(piece):
                raise bad_request(
                    f"query parameter {name!r} is not valid UTF-8 once percent-decoded",
                    parameter=name,
                )
            if has_control(piece.decode("utf-8")):
                raise bad_request(
                    f"query parameter {name!r} must not contain control characters",
                    parameter=name,
                )


def request_digest(spec: JobSpec) -> str:
    """The fingerprint an Idempotency-Key is held to: the parsed request, canonical (keys
    sorted at every level, defaults filled in, whitespace and escapes normalised), so the
    same JSON written differently is the same request."""
    return hashlib.sha256(_canonical(_canonical_spec(spec))).hexdigest()


def _canonical_spec(spec: JobSpec) -> JobSpec:
    return msgspec.structs.replace(
        spec,
        payload=_canonical_json(spec.payload),
        on_success=spec.on_success and _canonical_spec(spec.on_success),
        on_failure=spec.on_failure and _canonical_spec(spec.on_failure),
    )


def _canonical_json(raw: msgspec.Raw) -> msgspec.Raw:
    try:
        return msgspec.Raw(_canonical(_ANY.decode(raw)))
    except msgspec.DecodeError:  # valid JSON Python cannot hold (1e400): compare as sent
        return raw
