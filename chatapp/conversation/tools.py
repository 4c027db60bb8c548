"""The agent's tools, ``kb_search`` and a safe ``calculator`` (docs/memory.md §7); any failure becomes a result
starting with ``"error: "`` so the model can react."""

from __future__ import annotations

import ast
import json
import logging
import math
import operator
from collections.abc import Callable
from typing import Any

from chatapp.kb.search import kb_search, passages_fit, passages_format
from chatapp.llm.prompts import NO_PASSAGES_FOUND
from chatapp.orm_threads import orm_async
from memory.api import TokenCounter

logger = logging.getLogger(__name__)

CALCULATOR_MAX_CHARS = 200
# Integers are bounded by their size in bits, so no operation can take long or use much memory.
CALCULATOR_MAX_INT_BITS = 4096
CALCULATOR_MAX_EXPONENT = 10_000
KB_SEARCH_LIMIT = 4


class CalculatorError(ValueError):
    """The expression is not allowed arithmetic, or its value is out of bounds."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator_evaluate(expression: str) -> int | float:
    """The value of an arithmetic ``expression``, parsed with :mod:`ast`, never ``eval``: numbers,
    ``+ - * / // % **``, unary ``+ -`` and parentheses, within the size bounds above. Raises
    :class:`CalculatorError` for anything else (names, calls, division by zero, overflow, syntax errors)."""
    if len(expression) > CALCULATOR_MAX_CHARS:
        raise CalculatorError(f"expression is longer than {CALCULATOR_MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"not an arithmetic expression ({type(exc).__name__})") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise CalculatorError(f"only numbers are allowed, not {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed; use numbers and + - * / // % ** only")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > CALCULATOR_MAX_EXPONENT:
        raise CalculatorError(f"exponent is larger than {CALCULATOR_MAX_EXPONENT}")
    # |base| >= 2 ** (bit_length - 1), so this bounds the result from below without computing it;
    # anything that passes is at most twice the limit and is checked exactly afterwards.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and (abs(base).bit_length() - 1) * exponent > CALCULATOR_MAX_INT_BITS
    ):
        raise CalculatorError("result is too large")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > CALCULATOR_MAX_INT_BITS:
        raise CalculatorError("result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    return value


def calculator_format(value: int | float) -> str:
    """A number as result text: integers exactly, floats to 12 significant digits."""
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


async def tool_call_execute(tool_call: dict[str, Any], *, passages_max_tokens: int, counter: TokenCounter) -> str:
    """Run one OpenAI tool call; returns the tool message's text, ``"error: ..."`` on failure (never raises).
    ``kb_search`` returns the passages that fit ``passages_max_tokens``, so one result cannot crowd the window."""
    function = tool_call.get("function") or {}
    name = function.get("name") or ""
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as exc:
        return f"error: arguments are not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return "error: arguments must be a JSON object"
    try:
        if name == "calculator":
            expression = arguments.get("expression")
            if not isinstance(expression, str):
                return 'error: calculator needs {"expression": "<arithmetic>"}'
            return calculator_format(calculator_evaluate(expression))
        if name == "kb_search":
            query = arguments.get("query")
            if not isinstance(query, str) or not query.strip():
                return 'error: kb_search needs {"query": "<words>"}'
            found = await orm_async(kb_search)(query, KB_SEARCH_LIMIT)
            passages = passages_fit(found, budget_tokens=passages_max_tokens, counter=counter)
            return passages_format(passages) if passages else f"{NO_PASSAGES_FOUND} for {query!r}"
    except CalculatorError as exc:
        return f"error: {exc}"
    except Exception as exc:  # a tool failure is a result for the model, never a crashed turn
        logger.exception("tool %s failed", name)
        return f"error: {name} failed ({type(exc).__name__})"
    return f"error: unknown tool {name!r}; available tools: kb_search, calculator"
