"""The agent's tools: a calculator that parses with ``ast`` and never evaluates code, and the
tool-call runner that turns every failure into an ``error:`` result."""

from __future__ import annotations

import pytest

from chatapp.chats.memory import memory_config
from chatapp.conversation.tools import (
    CALCULATOR_MAX_CHARS,
    CalculatorError,
    calculator_evaluate,
    calculator_format,
    tool_call_execute,
)
from memory.messages import found_nothing
from memory.tokens.counter import get_counter

COUNTER = get_counter("gpt-4o-mini")


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("-2 ** 2", -4),
        ("+3 - -3", 6),
        ("1_000 * 1.5", 1500.0),
        ("2 ** -1", 0.5),
        ("1e3 / 8", 125.0),
        ("2 ** 4000 // 2 ** 3999", 2),
    ],
)
def test_arithmetic_is_evaluated(expression, value):
    assert calculator_evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('echo pwned')",
        "open('/etc/passwd').read()",
        "x + 1",
        "(1).__class__",
        "[1, 2][0]",
        "'a' * 3",
        "True + 1",
        "1j * 1j",
        "lambda: 1",
        "[x for x in range(10)]",
        "1 if 1 else 2",
        "1 < 2",
        "1 & 3",
        "1 << 100000",
        "2 ** 100000",
        "10 ** 10 ** 10",
        "(2 ** 4000) * (2 ** 4000) * (2 ** 4000)",
        "9.9e307 * 10",
        "2.0 ** 5000",
        "(-8) ** 0.5",
        "1 / 0",
        "5 // 0",
        "5 % 0",
        "",
        "1 +",
        "(" * 150 + "1" + ")" * 150,
        "1" * (CALCULATOR_MAX_CHARS + 1),
    ],
)
def test_anything_else_is_refused(expression):
    with pytest.raises(CalculatorError):
        calculator_evaluate(expression)


def test_results_are_formatted_compactly():
    assert calculator_format(calculator_evaluate("1 / 3")) == "0.333333333333"
    assert calculator_format(calculator_evaluate("600 * 60")) == "36000"


async def run(name: str, arguments: str) -> str:
    tool_call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return await tool_call_execute(tool_call, passages_max_tokens=200, counter=COUNTER)


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("calculator", '{"expression": "6 * 7"}', "42"),
        ("calculator", '{"expression": "a"}', "error: Name is not allowed; use numbers and + - * / // % ** only"),
        ("calculator", '{"expr": "1"}', 'error: calculator needs {"expression": "<arithmetic>"}'),
        ("calculator", "[1]", "error: arguments must be a JSON object"),
        ("calculator", "{", "error: arguments are not valid JSON (Expecting property name enclosed in double quotes)"),
        ("kb_search", '{"query": ""}', 'error: kb_search needs {"query": "<words>"}'),
        ("shell", "{}", "error: unknown tool 'shell'; available tools: kb_search, calculator"),
    ],
)
async def test_tool_failures_are_results(name, arguments, expected):
    assert await run(name, arguments) == expected


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_connections_closed")
async def test_kb_search_tool_returns_numbered_passages_within_budget(demo_kb):
    result = await run("kb_search", '{"query": "how many failed sign-in attempts lock the account"}')
    assert result.startswith("[1] Kestrel Sync security and privacy\n")
    assert COUNTER.count_text(result) <= 200 or result.count("[") == 1
    nothing = await run("kb_search", '{"query": "zzzyzzy"}')
    assert nothing == "no passages found for 'zzzyzzy'"
    # Memory knows it for a result that found nothing: it neither summarizes nor recalls it.
    assert found_nothing({"role": "tool", "content": nothing}, memory_config().empty_results)
    assert not found_nothing({"role": "tool", "content": result}, memory_config().empty_results)
