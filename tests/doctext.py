"""Reading the docs as a user would: their code blocks, code spans, shell commands and
tables, so tests can check each against the code (`tests/e2e/test_docs.py`,
`tests/e2e/api/test_docs_api.py`, `tests/e2e/client/test_readme_python.py`).

The docs are README.md, every page of the site under `docs/` and `deploy/README.md`."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEPLOY_README = ROOT / "deploy" / "README.md"
SITE = ROOT / "docs"  # the MkDocs pages (mkdocs.yml)
SITE_HOOKS = SITE / "hooks"  # the build's own code, not pages


def site_pages() -> tuple[Path, ...]:
    """Every Markdown page of the docs site, in path order (links are not followed)."""
    pages = [
        Path(folder) / name
        for folder, _, names in os.walk(SITE)
        if not Path(folder).is_relative_to(SITE_HOOKS)
        for name in names
        if name.endswith(".md")
    ]
    return tuple(sorted(pages))


PAGES = site_pages()
USER_DOCS = (README, *PAGES)  # what users read about GoQueue itself
DOCS = (*USER_DOCS, DEPLOY_README)

_FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language tag, its text (dedented) and where it starts."""

    lang: str
    text: str
    path: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One simple shell command: leading `NAME=value` assignments, then its words."""

    env: dict[str, str]
    argv: list[str]
    text: str
    where: str = field(default="")


def blocks(path: Path, *langs: str) -> list[Block]:
    """The fenced code blocks of a Markdown file, optionally only those in `langs`."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent, lang, body = match.groups()
        if langs and lang not in langs:
            continue
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        line_no = text.count("\n", 0, match.start()) + 1
        found.append(Block(lang, "\n".join(lines) + "\n", path, line_no))
    return found


def prose(path: Path) -> str:
    """The Markdown file without its fenced code blocks."""
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def spans(path: Path) -> list[str]:
    """The inline code spans of the prose (and of tables)."""
    return _SPAN.findall(prose(path))


def commands(block: Block) -> list[Command]:
    """The simple commands of a shell block, split at newlines, `;`, `&&`, `||` and `|`;
    a backslash-newline or a quote left open continues the line, as in a shell. A line of
    assignments alone sets variables for the lines after it, and is no command."""
    found: list[Command] = []
    for line in _logical_lines(block.text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in [*lexer, ";"]:
            if token in _SEPARATORS:
                command = _command(current, line, block.where)
                if command.argv:  # not a line that only sets variables (`PG=...`)
                    found.append(command)
                current = []
            else:
                current.append(token)
    return found


def shell_command(text: str, where: str = "") -> Command:
    """One command written inline (a code span)."""
    return _command(shlex.split(text), text, where)


def _command(words: list[str], text: str, where: str) -> Command:
    env: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return Command(env, words, text, where)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{raw}" if pending else raw
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        lines.append(pending)
        pending = ""
    if pending:
        raise ValueError(f"unterminated quote in a shell block: {pending!r}")
    return lines


def table(path: Path, heading: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the first table whose header
    row starts with `heading`."""
    rows: list[list[str]] = []
    inside = False
    for line in prose(path).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            if inside:
                break
            continue
        if not inside:
            inside = cells[0] == heading
            continue
        if set(cells[0]) <= {"-", ":"}:
            continue
        rows.append(cells)
    if not rows:
        raise AssertionError(f"{path.name}: no table headed {heading!r}")
    return rows


def the_table(heading: str) -> tuple[Path, list[list[str]]]:
    """The one table of the user docs whose header row starts with `heading`, and the
    page holding it: a second copy could drift from the one the tests check."""
    found = [(doc, table(doc, heading)) for doc in USER_DOCS if _has_table(doc, heading)]
    names = [str(doc.relative_to(ROOT)) for doc, _ in found]
    assert len(found) == 1, f"expected one table headed {heading!r} in the docs, found {names}"
    return found[0]


def _has_table(path: Path, heading: str) -> bool:
    return any(
        line.startswith("|") and line.strip().strip("|").split("|")[0].strip() == heading
        for line in prose(path).splitlines()
    )


def code_in(cell: str) -> list[str]:
    """The code spans of one table cell."""
    return _SPAN.findall(cell)
