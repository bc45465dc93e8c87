"""`bounded`: a failed attempt's traceback cut to a size, keeping the newest frames."""

from __future__ import annotations

from goqueue.actors.tracebacks import bounded


def _raise_from(depth: int) -> None:
    if depth:
        _raise_again(depth - 1)
    raise ValueError("the real cause")


def _raise_again(depth: int) -> None:
    _raise_from(depth)


def caught(depth: int, message: str = "the real cause") -> BaseException:
    try:
        if message != "the real cause":
            raise ValueError(message)
        _raise_from(depth)
    except ValueError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_short_traceback_is_whole() -> None:
    text = bounded(caught(1), 8192)
    assert text.startswith("Traceback (most recent call last):\n")
    assert "in _raise_again" in text and text.endswith("ValueError: the real cause\n")
    assert "omitted" not in text


def test_a_long_one_loses_its_oldest_frames_first() -> None:
    whole = bounded(caught(100), 1_000_000)
    text = bounded(caught(100), 1000)
    assert len(text.encode()) <= 1000 < len(whole.encode())
    omitted = int(text.splitlines()[1].split()[1])
    assert text.splitlines()[1] == f"  ... {omitted} earlier parts omitted ..."
    assert "in caught" not in text and text.endswith("ValueError: the real cause\n")
    assert whole.endswith(text.split("\n", 2)[2])  # what is kept is the whole one's end


def test_a_last_part_too_big_alone_keeps_its_end_in_whole_characters() -> None:
    text = bounded(caught(0, "é" * 5000 + " the end"), 301)
    assert len(text.encode()) <= 301 and text.endswith(" the end\n")
    assert "\ufffd" not in text


def test_zero_keeps_nothing() -> None:
    assert bounded(caught(1), 0) == ""


def test_the_frames_of_hidden_files_are_left_out() -> None:
    assert bounded(caught(1), 8192, frozenset({__file__})) == "ValueError: the real cause\n"
    assert __file__ in bounded(caught(1), 8192, frozenset({"elsewhere.py"}))
