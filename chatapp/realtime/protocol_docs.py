"""``docs/protocol.md`` generated from :mod:`chatapp.realtime.protocol` (its docstrings, the fields in wire order with
the docstring under each, the error and close codes), so the reference cannot drift from the code; the protocol docs
test fails when the file is stale."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from itertools import pairwise
from pathlib import Path

from chatapp.realtime import protocol

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
GENERATED_NOTE = (
    "<!-- Generated from chatapp/realtime/protocol.py by `python manage.py protocol_docs`; do not edit by hand "
    "(tests/chatapp/realtime/test_protocol_docs.py fails when this file is stale). -->"
)

# Sphinx roles (:class:`X`, :data:`X`, ...) and reStructuredText literals (``x``) as Markdown.
_ROLE = re.compile(r":(?:class|data|func|meth|mod|attr):`~?([^`]+)`")

EventClass = type[protocol.ServerEvent] | type[protocol.ClientEventBase]


def protocol_markdown() -> str:
    """The text of ``docs/protocol.md``. Raises ``ValueError`` when an event class or field has no docstring."""
    field_docs = _field_docstrings()
    lines = [
        "# WebSocket protocol",
        "",
        GENERATED_NOTE,
        "",
        *_paragraphs(protocol.__doc__ or ""),
        "",
        "## Events",
        "",
        "Types are written as Python annotations: `str` is a JSON string, `int` an integer, `bool` "
        "true or false, `None` null, `list` an array and `dict` an object.",
        "",
        "| type | direction | class |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| [`{cls.type}`](#{_anchor(cls)}) | client → server | `{cls.__name__}` |" for cls in protocol.CLIENT_EVENTS
    ]
    lines += [
        f"| [`{cls.type}`](#{_anchor(cls)}) | server → client | `{cls.__name__}` |" for cls in protocol.SERVER_EVENTS
    ]
    lines += ["", "## Client events", ""]
    for client_class in protocol.CLIENT_EVENTS:
        lines += _event_section(client_class, field_docs)
    lines += [
        "## Server events",
        "",
        *_paragraphs(protocol.ServerEvent.__doc__ or ""),
        "",
    ]
    for server_class in protocol.SERVER_EVENTS:
        lines += _event_section(server_class, field_docs)
    lines += [
        "## Error codes",
        "",
        *_paragraphs(_attribute_docstring("ERROR_CODES")),
        "",
        "| code | meaning |",
        "| --- | --- |",
        *[f"| `{code}` | {_cell(meaning)} |" for code, meaning in protocol.ERROR_CODES.items()],
        "",
        "## Close codes",
        "",
        *_paragraphs(_attribute_docstring("CLOSE_CODES")),
        "",
        "| code | meaning |",
        "| --- | --- |",
        *[f"| {code} | {_cell(meaning)} |" for code, meaning in protocol.CLOSE_CODES.items()],
    ]
    return "\n".join(lines) + "\n"


def protocol_docs_write(path: Path = DOCS_PATH) -> bool:
    """Write :func:`protocol_markdown` to ``path``; returns whether the file changed."""
    text = protocol_markdown()
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def _event_section(cls: EventClass, field_docs: dict[tuple[str, str], str]) -> list[str]:
    if not cls.__doc__:
        raise ValueError(f"{cls.__name__} has no docstring")
    lines = [f"### `{cls.type}`", "", f"`{cls.__name__}`: " + " ".join(_markdown(cls.__doc__).split()), ""]
    event_fields = dataclasses.fields(cls)
    if not event_fields:
        return [*lines, "No fields besides `type`.", ""]
    omitted: frozenset[str] = getattr(cls, "omit_when_none", frozenset())
    lines += ["| key | type | meaning |", "| --- | --- | --- |"]
    for item in event_fields:
        doc = field_docs.get((cls.__name__, item.name))
        if not doc:
            raise ValueError(f"{cls.__name__}.{item.name} has no docstring")
        if item.name in omitted:
            doc += " Absent when null."  # see ServerEvent.omit_when_none
        lines.append(f"| `{item.name}` | `{_cell(str(item.type))}` | {_cell(doc)} |")
    return [*lines, ""]


def _field_docstrings() -> dict[tuple[str, str], str]:
    """``{(class name, field name): docstring}``: the string literal right under each annotated field."""
    tree = ast.parse(inspect.getsource(protocol))
    docs: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for statement, following in pairwise(node.body):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[(node.name, statement.target.id)] = inspect.cleandoc(following.value.value)
    return docs


def _attribute_docstring(name: str) -> str:
    """The string literal written right under the module-level assignment of ``name``."""
    body = ast.parse(inspect.getsource(protocol)).body
    for statement, following in pairwise(body):
        targets = [statement.target] if isinstance(statement, ast.AnnAssign) else getattr(statement, "targets", [])
        if (
            any(isinstance(target, ast.Name) and target.id == name for target in targets)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            return inspect.cleandoc(following.value.value)
    raise ValueError(f"{name} has no docstring")


def _paragraphs(docstring: str) -> list[str]:
    """A docstring as Markdown paragraphs, one line each."""
    text = _markdown(inspect.cleandoc(docstring))
    return [line for paragraph in text.split("\n\n") for line in (" ".join(paragraph.split()), "")][:-1]


def _markdown(text: str) -> str:
    text = _ROLE.sub(lambda match: f"``{match.group(1)}``", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    return " ".join(_markdown(text).split()).replace("|", "\\|")


def _anchor(cls: EventClass) -> str:
    """GitHub's anchor of the event's heading (``### `chat.send` ``): lower case, dots dropped."""
    return re.sub(r"[^a-z0-9_-]", "", cls.type.lower())
