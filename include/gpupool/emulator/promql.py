"""The PromQL subset the simulated Prometheus evaluates.

Supported: instant vector selectors with label matchers (``=``, ``!=``, ``=~``, ``!~``, also on
``__name__``), ``timestamp(<selector>)`` (each sample's own time), the aggregations ``sum``, ``min``, ``max``, ``avg``, ``count`` and ``group`` with
``by``/``without`` (before or after the argument), scalar arithmetic between a vector and a number
(``+ - * /``, which drops the metric name as Prometheus does) and number literals. Everything else
raises :class:`PromQLError` with a position, which the facade answers with Prometheus's own
``bad_data`` error — the client then sees exactly what a real server says of a bad query.

Evaluation is over a grid of instants: a selector is resolved by a callback to series as
``(labels, values)`` with ``values`` aligned to the grid (NaN where the series has no sample);
for ``timestamp()`` the callback is asked with ``stamps=True`` and answers the samples' own times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

AGGREGATIONS = ("sum", "min", "max", "avg", "count", "group")
_ARITH = "+-*/"


class PromQLError(ValueError):
    """A query outside the supported subset or malformed; ``pos`` is 1-based like Prometheus's."""

    def __init__(self, message: str, pos: int = 1):
        super().__init__(message)
        self.pos = pos

    def prometheus_message(self) -> str:
        """The text a real Prometheus puts in ``error`` for a query it cannot parse."""
        return f'invalid parameter "query": 1:{self.pos}: parse error: {self}'


@dataclass(frozen=True)
class Matcher:
    """One label matcher."""

    name: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        literals = _literal_alternatives(self.value)
        hit = (v in literals) if literals is not None else re.fullmatch(self.value, v) is not None
        return hit if self.op == "=~" else not hit


_LITERAL_CACHE: dict[str, frozenset[str] | None] = {}
_META = set(".^$*+?()[]{}|\\")


def _literal_alternatives(pattern: str) -> frozenset[str] | None:
    """The strings an alternation of escaped literals (``a|b\\.c``) matches, else None.

    A selector naming a thousand nodes is such a pattern: a set lookup answers it in constant
    time where the regex engine would try every alternative in turn."""
    if pattern in _LITERAL_CACHE:
        return _LITERAL_CACHE[pattern]
    out: set[str] | None = set()
    cur: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and pattern[i + 1] in _META | {"-", "/", "#", "&", "~", " "}:
            cur.append(pattern[i + 1])
            i += 2
            continue
        if c == "|":
            out.add("".join(cur))
            cur = []
        elif c in _META:
            out = None
            break
        else:
            cur.append(c)
        i += 1
    if out is not None:
        out.add("".join(cur))
    result = frozenset(out) if out is not None else None
    if len(_LITERAL_CACHE) > 256:
        _LITERAL_CACHE.clear()
    _LITERAL_CACHE[pattern] = result
    return result


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    @property
    def metric(self) -> str | None:
        """The metric name when a ``__name__ =`` matcher fixes it."""
        for m in self.matchers:
            if m.name == "__name__" and m.op == "=":
                return m.value
        return None


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: object
    labels: tuple[str, ...]
    without: bool


@dataclass(frozen=True)
class Timestamp:
    """``timestamp(selector)``: the time of each series' sample at each instant."""

    selector: Selector


@dataclass(frozen=True)
class Arith:
    op: str
    lhs: object
    rhs: object


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>=~|!~|!=|==|>=|<=|[{}(),=+\-*/^%<>\[\]@])
    )""",
    re.VERBOSE,
)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, i = [], 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        m = _TOKEN.match(text, i)
        if not m or m.end() == i:
            j = i + len(text[i:]) - len(text[i:].lstrip())
            raise PromQLError(f"unexpected character: {text[j]!r}", j + 1)
        kind = m.lastgroup
        start = m.start(kind)
        out.append((kind, m.group(kind), start + 1))
        i = m.end()
    out.append(("eof", "", len(text) + 1))
    return out


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self, kind: str | None = None, value: str | None = None) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        if (kind and tok[0] != kind) or (value is not None and tok[1] != value):
            want = value or kind
            got = "end of input" if tok[0] == "eof" else repr(tok[1])
            raise PromQLError(f"unexpected {got}, expected {want}", tok[2])
        self.i += 1
        return tok

    def parse(self):
        expr = self.expr()
        tok = self.peek()
        if tok[0] != "eof":
            raise PromQLError(f"unexpected {tok[1]!r}", tok[2])
        return expr

    def expr(self):
        lhs = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in _ARITH:
            op = self.take()[1]
            rhs = self.unary()
            lhs = Arith(op, lhs, rhs)
        tok = self.peek()
        if tok[0] == "op" and tok[1] in ("==", "!=", ">", "<", ">=", "<=", "^", "%"):
            raise PromQLError(f"operator {tok[1]!r} is not supported by this server (selectors, aggregations "
                              "and scalar + - * / only)", tok[2])
        if tok[0] == "ident" and tok[1] in ("and", "or", "unless", "offset", "bool", "on", "ignoring"):
            raise PromQLError(f"{tok[1]!r} is not supported by this server", tok[2])
        return lhs

    def unary(self):
        kind, val, pos = self.peek()
        if kind == "op" and val == "-":
            self.take()
            inner = self.unary()
            if isinstance(inner, Number):
                return Number(-inner.value)
            return Arith("*", Number(-1.0), inner)
        if kind == "num":
            self.take()
            return Number(float(val))
        if kind == "op" and val == "(":
            self.take()
            inner = self.expr()
            self.take("op", ")")
            return inner
        if kind == "op" and val == "{":
            return self.selector(None, pos)
        if kind == "ident":
            if val in AGGREGATIONS:
                return self.aggregate()
            self.take()
            nxt = self.peek()
            if nxt[0] == "op" and nxt[1] == "(" and val == "timestamp":
                self.take()
                inner = self.expr()
                self.take("op", ")")
                if not isinstance(inner, Selector):
                    raise PromQLError("timestamp() of anything but a vector selector is not supported by this server",
                                      pos)
                return Timestamp(inner)
            if nxt[0] == "op" and nxt[1] == "(":
                raise PromQLError(f"function {val!r} is not supported by this server (selectors, aggregations "
                                  "and scalar arithmetic only)", pos)
            if val in ("NaN", "Inf", "nan", "inf"):
                return Number(float(val))
            return self.selector(val, pos)
        got = "end of input" if kind == "eof" else repr(val)
        raise PromQLError(f"unexpected {got}", pos)

    def selector(self, name: str | None, pos: int) -> Selector:
        matchers = [Matcher("__name__", "=", name)] if name else []
        if self.peek()[0] == "op" and self.peek()[1] == "{":
            self.take()
            while not (self.peek()[0] == "op" and self.peek()[1] == "}"):
                label = self.take("ident")[1]
                op_tok = self.peek()
                if op_tok[0] != "op" or op_tok[1] not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"unexpected {op_tok[1]!r} in label matching, expected one of =, !=, =~, !~",
                                      op_tok[2])
                self.take()
                value = _unquote(self.take("str")[1])
                if op_tok[1] in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise PromQLError(f"error parsing regexp: {exc}", op_tok[2]) from exc
                matchers.append(Matcher(label, op_tok[1], value))
                if self.peek()[0] == "op" and self.peek()[1] == ",":
                    self.take()
                elif not (self.peek()[0] == "op" and self.peek()[1] == "}"):
                    tok = self.peek()
                    raise PromQLError(f"unexpected {tok[1]!r} in label matching, expected \",\" or \"}}\"", tok[2])
            self.take("op", "}")
        nxt = self.peek()
        if nxt[0] == "op" and nxt[1] in ("[", "@"):
            raise PromQLError("range vectors and @ modifiers are not supported by this server", nxt[2])
        # Prometheus refuses selectors every series would match (all matchers accept "")
        if not any(not m.matches({}) for m in matchers):
            raise PromQLError("vector selector must contain at least one non-empty matcher", pos)
        return Selector(tuple(matchers))

    def grouping(self) -> tuple[str, ...]:
        self.take("op", "(")
        labels = []
        while not (self.peek()[0] == "op" and self.peek()[1] == ")"):
            labels.append(self.take("ident")[1])
            if self.peek()[0] == "op" and self.peek()[1] == ",":
                self.take()
        self.take("op", ")")
        return tuple(labels)

    def aggregate(self) -> Aggregate:
        op = self.take("ident")[1]
        labels, without = (), False
        if self.peek()[0] == "ident" and self.peek()[1] in ("by", "without"):
            without = self.take()[1] == "without"
            labels = self.grouping()
        self.take("op", "(")
        inner = self.expr()
        if self.peek()[0] == "op" and self.peek()[1] == ",":
            raise PromQLError(f"aggregation {op!r} takes one argument here", self.peek()[2])
        self.take("op", ")")
        if not labels and self.peek()[0] == "ident" and self.peek()[1] in ("by", "without"):
            without = self.take()[1] == "without"
            labels = self.grouping()
        return Aggregate(op, inner, labels, without)


def parse(text: str):
    """Parse ``text`` into the subset's syntax tree; raises :class:`PromQLError`."""
    if not text or not text.strip():
        raise PromQLError("no expression found in input", 1)
    return _Parser(text).parse()


def selectors(node) -> list[Selector]:
    """Every vector selector of a parsed expression, left to right."""
    if isinstance(node, Selector):
        return [node]
    if isinstance(node, Timestamp):
        return [node.selector]
    if isinstance(node, Aggregate):
        return selectors(node.expr)
    if isinstance(node, Arith):
        return selectors(node.lhs) + selectors(node.rhs)
    return []


def parse_selector(text: str) -> Selector:
    """Parse a ``match[]`` argument: a plain selector only."""
    node = parse(text)
    if not isinstance(node, Selector):
        raise PromQLError("expected a vector selector in match[]", 1)
    return node


Series = tuple[dict[str, str], np.ndarray]
Resolver = Callable[..., list[Series]]  # (selector, stamps=False) -> series


def evaluate(node, resolve: Resolver, n: int) -> list[Series] | np.ndarray:
    """Evaluate over ``n`` instants: a list of series, or an array for a scalar expression."""
    if isinstance(node, Number):
        return np.full(n, node.value)
    if isinstance(node, Selector):
        return resolve(node)
    if isinstance(node, Timestamp):
        # like Prometheus, timestamp() drops the metric name
        return [(_drop_name(lab), v) for lab, v in resolve(node.selector, stamps=True)]
    if isinstance(node, Arith):
        lhs, rhs = evaluate(node.lhs, resolve, n), evaluate(node.rhs, resolve, n)
        if isinstance(lhs, list) and isinstance(rhs, list):
            raise PromQLError("binary operations between two vectors are not supported by this server", 1)
        fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[node.op]
        with np.errstate(divide="ignore", invalid="ignore"):
            if isinstance(lhs, list):
                return [(_drop_name(lab), fn(v, rhs)) for lab, v in lhs]
            if isinstance(rhs, list):
                return [(_drop_name(lab), fn(lhs, v)) for lab, v in rhs]
            return fn(lhs, rhs)
    if isinstance(node, Aggregate):
        inner = evaluate(node.expr, resolve, n)
        if not isinstance(inner, list):
            raise PromQLError(f"expected type instant vector in aggregation expression, got scalar", 1)
        groups: dict[tuple, tuple[dict, list[np.ndarray]]] = {}
        for labels, values in inner:
            if node.without:
                key_labels = {k: v for k, v in labels.items() if k not in node.labels and k != "__name__"}
            else:
                key_labels = {k: labels[k] for k in node.labels if labels.get(k, "") != ""}
            key = tuple(sorted(key_labels.items()))
            groups.setdefault(key, (key_labels, []))[1].append(values)
        out = []
        for key_labels, arrays in groups.values():
            stack = np.vstack(arrays)
            present = ~np.isnan(stack)
            any_present = present.any(axis=0)
            with np.errstate(invalid="ignore", divide="ignore"):
                if node.op == "sum":
                    val = np.nansum(stack, axis=0)
                elif node.op == "count":
                    val = present.sum(axis=0).astype(float)
                elif node.op == "group":
                    val = np.ones(n)
                elif node.op == "avg":
                    val = np.nansum(stack, axis=0) / np.maximum(present.sum(axis=0), 1)
                elif node.op == "min":
                    val = np.min(np.where(present, stack, np.inf), axis=0)
                else:
                    val = np.max(np.where(present, stack, -np.inf), axis=0)
            out.append((key_labels, np.where(any_present, val, np.nan)))
        return out
    raise PromQLError("unsupported expression", 1)


def _drop_name(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


def format_value(v: float) -> str:
    """A sample value as Prometheus writes it in JSON."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))
