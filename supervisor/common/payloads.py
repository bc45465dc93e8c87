"""The check at enqueue of a typed actor's payload: the type its worker reported
(`ActorInfo.shape`), rebuilt once per shape, decodes the payload; a misfit is
InvalidPayload naming the field. A classic actor has no shape and costs nothing here."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import msgspec
from goqueue.actors.shapes import rebuild
from goqueue.actors.typed import PayloadMisfit, check
from goqueue.supervisor.common.errors import InvalidPayload

log = logging.getLogger("goqueue.payloads")


@lru_cache(maxsize=512)  # a pure function of the shape: rebuilt once per reload at most
def _decoder(shape: bytes) -> msgspec.json.Decoder[Any] | None:
    try:
        return msgspec.json.Decoder(rebuild(shape))
    except (TypeError, ValueError, KeyError, msgspec.DecodeError):
        # a worker's own shape that does not rebuild: its workers still check each payload
        log.exception("cannot rebuild a payload type; payloads go unchecked at enqueue")
        return None


def check_payload(shape: bytes, keyword: bool, payload: msgspec.Raw, path: str = "") -> None:
    """Raise InvalidPayload when `payload` does not fit the type `shape` describes; the
    field is named under `path` (a template's `on_success.`)."""
    decoder = _decoder(shape)
    if decoder is None:
        return
    try:
        check(decoder, bytes(payload), keyword)
    except PayloadMisfit as exc:
        raise InvalidPayload(exc.reason, f"{path}{exc.field}") from None
