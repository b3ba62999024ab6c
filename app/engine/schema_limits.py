"""Bounds on a JSON schema before it becomes a grammar, and the grammar made from it.

llama.cpp's grammar sampler costs, per sampling step, about one pass over the vocabulary for every parse stack
alive at that point, and its parser recurses once per nested group. A schema can ask for far more than either
survives, so every schema is checked here before it is converted, and refused by name when it would not fit:

- the count keywords (``minItems``, ``maxItems``, ``minLength``, ``maxLength``) and ``{m,n}`` quantifiers inside
  a ``pattern`` are whole numbers from 0 to ``MAX_REPEAT`` with min <= max. The converter writes a count n as n
  nested optional groups: llama.cpp's parser refuses more than 1000 of them ("exceeds sane defaults") and from
  about 32768 it overflows its stack (SIGSEGV); a minimum is n copies side by side (10^9 is about 50 GB);
- a ``pattern`` is parsed here (ECMAScript syntax, anchored with ^ and $) and simulated: the most positions of
  it that can be alive at once (the parse stacks llama.cpp keeps: ambiguity such as ``(a{0,30}){0,30}``, where
  one string matches in many ways, multiplies them) is at most ``MAX_WIDTH``, and its expansion (every copy a
  count makes) at most ``MAX_PATTERN_POSITIONS``;
- across the schema, alternatives alive at once (``anyOf``/``oneOf``/type lists add up, nesting multiplies
  through them, optional properties each start one) are at most ``MAX_WIDTH`` too;
- the schema has at most ``MAX_NODES`` subschemas, ``MAX_DEPTH`` levels, ``MAX_ENUM`` values in an enum and
  ``MAX_OPTIONAL_PROPERTIES`` optional properties in an object (the converter's time is quadratic in them);
- the grammar text is at most ``MAX_GRAMMAR_BYTES`` (llama.cpp copies all of it for every verify pass) and
  ``MAX_GRAMMAR_RULES`` rules.

Measured on llama.cpp through llama-cpp-python 0.3.36 with SmolLM2's 49152-token vocabulary, one CPU thread
(one ``llama_sampler_apply`` under a plain grammar: 3-8 ms):

- maxLength/maxItems 1000 parse in 1 ms and apply takes at most 38 ms at any depth of them; 1001 and 16384
  are refused by the parser, 32768 and 100000 crash it (SIGSEGV);
- a pattern 57 wide (``(a{0,8}){0,8}``): at most 30 ms per apply; 111 wide: 54 ms; 871 wide
  (``(a{0,30}){0,30}``): 2.5 s; 64 alternatives of anyOf: 32 ms; 63 optional properties: 100 ms (256: 0.48 s);
- an enum of 256 values: 60 ms on its first step (1024: 0.42 s);
- a 256 KiB grammar parses in 48 ms and clones (once per verify pass) in 3.6 ms; 1 MiB: 133 ms and 14 ms.

Conversion goes through llama-cpp-python's converter with two repairs: local references (``#/$defs/...``,
``#/definitions/...``, any JSON pointer inside the schema) resolve wherever they are, the root included and
recursively, under rule names of their own; and patterns are turned into GBNF here (the converter leaves
escapes such as ``\\.`` and ``\\d`` as GBNF escapes llama.cpp does not know, and writes characters a JSON
string must escape as they are).

Over 500 lines: the bounds and the GBNF written from a pattern are one simulation of what llama.cpp's parser
will hold, so a limit sits beside the rule it bounds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from app.errors import SettingsError

MAX_REPEAT = 1000  # llama.cpp's parser refuses 1001 nested optional groups (MAX_REPETITION_THRESHOLD, 2 rules each)
MAX_WIDTH = 64  # parse stacks alive at once
MAX_PATTERN_POSITIONS = 4096  # a pattern's atoms once every count is written out
MAX_PATTERN_WORK = 200_000  # steps of the simulation that finds a pattern's width; past it, refused as too complex
MAX_PATTERN_GROUP_DEPTH = 32
MAX_NODES = 4096
MAX_DEPTH = 64
MAX_ENUM = 256  # each value is a parse stack until told apart; a quarter of a unit of MAX_WIDTH
MAX_OPTIONAL_PROPERTIES = 64
MAX_GRAMMAR_BYTES = 256 << 10
MAX_GRAMMAR_RULES = 8192

TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
_COUNTS = (("minItems", "maxItems"), ("minLength", "maxLength"))
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_UNICODE_MAX = 0x10FFFF


def _refuse(where: str, what: str) -> SettingsError:
    if len(where) > 120:
        where = where[:40] + "..." + where[-77:]
    return SettingsError(f"The JSON schema cannot be used: {where} {what}")


# --- the schema ------------------------------------------------------------------------------------------------

@dataclass
class CheckedSchema:
    """A schema that passed: ``schema`` is the copy the converter gets (``true`` subschemas as ``{}``, whole
    floats as ints), ``refs`` each local reference's target in it, ``patterns`` each pattern parsed."""

    schema: dict[str, Any]
    refs: dict[str, Any] = field(default_factory=dict)
    patterns: dict[str, _Node] = field(default_factory=dict)
    repeats: int = 0  # the sum over counts of count x rule-name length: what the grammar text grows with


def check_schema(schema: Any) -> CheckedSchema:
    """``schema`` (parsed JSON) checked against every bound above; SettingsError names the keyword, where it
    is (``schema.properties.a.maxLength``) and the bound."""
    checker = _Checker()
    if not isinstance(schema, dict):
        raise _refuse("schema", "must be a JSON object.")
    normal = checker.normalize(schema, "schema", 0, name_len=4)
    assert isinstance(normal, dict)
    checked = CheckedSchema(normal, patterns=checker.patterns, repeats=checker.repeats)
    for ref, where in checker.ref_sites:
        checked.refs[ref] = _resolve_pointer(normal, ref, where)
    # The text grows with the counts (each copy names its item's rule) and otherwise about twice the schema's
    # size: an estimate past the bound is refused before the converter writes it (check_grammar checks the text).
    estimate = checker.repeats + 2 * len(json.dumps(schema))
    if estimate > MAX_GRAMMAR_BYTES:
        raise _refuse("schema", f"would make a grammar of about {estimate >> 10} KiB (its maxItems, maxLength "
                      f"and pattern counts add up); at most {MAX_GRAMMAR_BYTES >> 10} KiB are taken.")
    _Width(checked).check(normal)
    return checked


def schema_grammar(response_format: str) -> str:
    """The GBNF for a JSON schema given as text, checked and bounded; SettingsError names what is refused."""
    try:
        schema = json.loads(response_format)
    except RecursionError:
        raise _refuse("schema", f"is nested more than {MAX_DEPTH} deep.") from None
    except ValueError as exc:
        raise SettingsError(f"The response format is not valid JSON: {exc}") from None
    checked = check_schema(schema)
    try:
        text = _convert(checked)
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise SettingsError(f"The JSON schema cannot be turned into a grammar: {exc}") from None
    check_grammar(text)
    return text


def check_grammar(text: str) -> None:
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise _refuse("schema", f"makes a grammar of {size >> 10} KiB; at most {MAX_GRAMMAR_BYTES >> 10} KiB "
                      "are taken (lower its maxItems, maxLength or pattern counts, or split it).")
    rules = text.count("::=")
    if rules > MAX_GRAMMAR_RULES:
        raise _refuse("schema", f"makes a grammar of {rules} rules; at most {MAX_GRAMMAR_RULES} are taken.")


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


class _Checker:
    def __init__(self) -> None:
        self.nodes = 0
        self.repeats = 0
        self.ref_sites: list[tuple[str, str]] = []
        self.patterns: dict[str, _Node] = {}

    def subschema(self, value: Any, where: str, depth: int, name_len: int, *, allow_false: bool = False) -> Any:
        if value is True:
            return {}
        if value is False:
            if allow_false:
                return False
            raise _refuse(where, "is false: nothing matches it.")
        if not isinstance(value, dict):
            raise _refuse(where, f"must be a schema (an object), not {_show(value)}.")
        return self.normalize(value, where, depth, name_len)

    def normalize(self, schema: dict[str, Any], where: str, depth: int, name_len: int) -> dict[str, Any]:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _refuse("schema", f"has more than {MAX_NODES} subschemas.")
        if depth > MAX_DEPTH:
            raise _refuse(where, f"is nested more than {MAX_DEPTH} deep.")
        out: dict[str, Any] = dict(schema)
        kind = schema.get("type")
        if "type" in schema:
            kinds = kind if isinstance(kind, list) else [kind]
            if not kinds or not all(isinstance(k, str) for k in kinds):
                raise _refuse(f"{where}.type", f"must be a type name or a non-empty list of them, not "
                              f"{_show(kind)}.")
            odd = [str(k) for k in kinds if k not in TYPES]
            if odd:
                raise _refuse(f"{where}.type", f"names the type {odd[0][:40]!r}; the types are "
                              f"{', '.join(sorted(TYPES))}.")
            if len(set(kinds)) != len(kinds):
                raise _refuse(f"{where}.type", "lists a type twice.")
        for low, high in _COUNTS:
            counts = {}
            for key in (low, high):
                if key in schema:
                    n = _whole(schema[key])
                    if n is None or n < 0:
                        raise _refuse(f"{where}.{key}", f"must be a whole number of at least 0, not "
                                      f"{_show(schema[key])}.")
                    if n > MAX_REPEAT:
                        raise _refuse(f"{where}.{key}", f"is {n}; at most {MAX_REPEAT} is taken (llama.cpp's "
                                      "grammar cannot hold more repetitions).")
                    counts[key] = out[key] = n
            if low in counts and high in counts and counts[low] > counts[high]:
                raise _refuse(f"{where}.{low}", f"({counts[low]}) is more than {high} ({counts[high]}): nothing "
                              "matches.")
            if counts:
                per = name_len + 24 if low == "minItems" else 8  # "(item " and ")?" for each
                self.repeats += max(counts.values()) * per
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise _refuse(f"{where}.pattern", f"must be a string (a regular expression), not {_show(pattern)}.")
            node = parse_pattern(pattern, f"{where}.pattern")
            self.patterns[pattern] = node
            self.repeats += _repeat_text(node, name_len + 4)
        if "format" in schema and not isinstance(schema["format"], str):
            raise _refuse(f"{where}.format", f"must be a string, not {_show(schema['format'])}.")
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise _refuse(f"{where}.enum", f"must be a non-empty list, not {_show(values)}.")
            if len(values) > MAX_ENUM:
                raise _refuse(f"{where}.enum", f"has {len(values)} values; at most {MAX_ENUM} are taken.")
        if "required" in schema:
            required = schema["required"]
            if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
                raise _refuse(f"{where}.required", f"must be a list of property names, not {_show(required)}.")
        if "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str):
                raise _refuse(f"{where}.$ref", f"must be a string, not {_show(ref)}.")
            if not ref.startswith("#"):
                raise _refuse(f"{where}.$ref", f"is {ref[:80]!r}, a reference outside the schema; only "
                              "references inside it (#/$defs/..., #/definitions/...) are supported.")
            self.ref_sites.append((ref, f"{where}.$ref"))
        for key in _SCHEMA_MAPS:
            if key in schema:
                value = schema[key]
                if not isinstance(value, dict):
                    raise _refuse(f"{where}.{key}", f"must be an object, not {_show(value)}.")
                if key == "properties":
                    out[key] = {name: self.subschema(sub, f"{where}.{key}.{name}", depth + 1,
                                                     name_len + len(name) + 1) for name, sub in value.items()}
                else:
                    out[key] = {name: self.subschema(sub, f"{where}.{key}.{name}", depth + 1, len(name) + 4)
                                for name, sub in value.items()}
        if isinstance(out.get("properties"), dict):
            required_set = set(out.get("required", []))
            optional = [name for name in out["properties"] if name not in required_set]
            if len(optional) > MAX_OPTIONAL_PROPERTIES:
                raise _refuse(f"{where}.properties", f"has {len(optional)} optional properties; at most "
                              f"{MAX_OPTIONAL_PROPERTIES} are taken (list the others in 'required').")
        for key in _SCHEMA_LISTS:
            if key in schema:
                value = schema[key]
                if not isinstance(value, list) or not value:
                    raise _refuse(f"{where}.{key}", f"must be a non-empty list of schemas, not {_show(value)}.")
                out[key] = [self.subschema(sub, f"{where}.{key}[{i}]", depth + 1, name_len + 8)
                            for i, sub in enumerate(value)]
        if "items" in schema:
            items = schema["items"]
            if isinstance(items, list):
                if not items:
                    raise _refuse(f"{where}.items", "must not be an empty list.")
                out["items"] = [self.subschema(sub, f"{where}.items[{i}]", depth + 1, name_len + 8)
                                for i, sub in enumerate(items)]
            else:
                out["items"] = self.subschema(items, f"{where}.items", depth + 1, name_len + 5,
                                              allow_false="prefixItems" in schema)
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            out["additionalProperties"] = extra if isinstance(extra, bool) else self.subschema(
                extra, f"{where}.additionalProperties", depth + 1, name_len + 16)
        return out


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve_pointer(schema: dict[str, Any], ref: str, where: str) -> Any:
    """The target of a local reference ("#" or a JSON pointer after "#"); SettingsError when it has none."""
    if ref == "#":
        return schema
    if not ref.startswith("#/"):
        raise _refuse(where, f"is {ref[:80]!r}; only JSON pointers (#/$defs/name) are supported, not anchors.")
    from urllib.parse import unquote

    target: Any = schema
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise _refuse(where, f"is {ref[:80]!r}, which points at nothing in the schema.")
    if not isinstance(target, dict):
        raise _refuse(where, f"is {ref[:80]!r}, which points at {_show(target)}, not a schema.")
    return target


Start = tuple[frozenset[str] | None, str]  # the characters an answer may start with (None: any), and a text
# every answer starts with, spaces left out (the grammar allows optional spaces between tokens)
_NUMBER_START = frozenset("-0123456789")
_TYPE_START: dict[str, Start] = {
    "string": (frozenset('"'), '"'), "number": (_NUMBER_START, ""), "integer": (_NUMBER_START, ""),
    "boolean": (frozenset("tf"), ""), "null": (frozenset("n"), "null"), "object": (frozenset("{"), "{"),
    "array": (frozenset("["), "["),
}


def _common_prefix(texts: list[str]) -> str:
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def _union_start(starts: list[Start]) -> Start:
    chars: frozenset[str] | None = frozenset()
    for c, _ in starts:
        chars = None if c is None or chars is None else chars | c
    return chars, _common_prefix([p for _, p in starts])


def _apart(a: Start, b: Start) -> bool:
    """Whether no text reaches past the start of both: the two are told apart before either nests anything."""
    if a[0] is not None and b[0] is not None and not a[0] & b[0]:
        return True
    return bool(a[1]) and bool(b[1]) and not a[1].startswith(b[1]) and not b[1].startswith(a[1])


def _children(schema: dict[str, Any]) -> Iterator[Any]:
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            yield from schema[key].values()
    for key in ("anyOf", "oneOf", "allOf", "prefixItems", "items"):
        value = schema.get(key)
        if isinstance(value, list):
            yield from value
        elif isinstance(value, dict):
            yield value
    if isinstance(schema.get("additionalProperties"), dict):
        yield schema["additionalProperties"]


class _Width:
    """The most alternatives of the schema alive at once, as the converter's grammar has them: anyOf, oneOf and
    type lists add up their alternatives' widths, except alternatives told apart by how they start (their first
    characters, or a text such as '{"kind":'), of which one is alive once that start is read; an object is as
    wide as its widest property or its optional properties (each a branch until its key is read), an array as
    its items, an enum a quarter of its values (literal branches are cheap), a pattern as ``pattern_width``.
    A reference counts as its target: the references are solved together (repeatedly, in the order they depend
    on each other), so a reference back into itself through alternatives that start alike grows each round, as
    the parse stacks multiply with each level of the answer, until it is refused."""

    def __init__(self, checked: CheckedSchema) -> None:
        self.checked = checked
        self.values: dict[str, int] = {}
        self.patterns: dict[str, int] = {}
        self.round = 0
        self.starting: set[str] = set()
        self.starts: dict[str, Start] = {}

    def check(self, root: dict[str, Any]) -> None:
        order: list[str] = []
        seen: set[str] = set()

        def visit(schema: Any, depth: int) -> None:
            if not isinstance(schema, dict):
                return
            if depth > 2 * MAX_DEPTH:
                raise _refuse("schema", f"leads more than {2 * MAX_DEPTH} levels deep through its references.")
            ref = schema.get("$ref")
            if isinstance(ref, str):
                if ref not in seen:
                    seen.add(ref)
                    visit(self.checked.refs[ref], depth + 1)
                    order.append(ref)  # after what it depends on
                return
            for sub in _children(schema):
                visit(sub, depth + 1)

        visit(root, 0)
        self.values = dict.fromkeys(order, 1)
        for self.round in range(MAX_WIDTH + 2):
            changed = False
            for ref in order:
                width = self.of(self.checked.refs[ref], "schema" + ref[1:].replace("/", "."))
                changed = changed or width != self.values[ref]
                self.values[ref] = width
            if not changed:
                break
        self.of(root, "schema")

    def of(self, schema: Any, where: str) -> int:
        if not isinstance(schema, dict):
            return 1
        width = self._of(schema, where)
        if width > MAX_WIDTH:
            why = (" (it refers back to itself through alternatives that start alike, so they multiply with each "
                   "level of the answer)") if self.round else ""
            raise _refuse(where, f"can have {width} alternatives alive at once{why}; anyOf, oneOf, type lists, "
                          f"enums and optional properties add up, and multiply when nested; at most {MAX_WIDTH} "
                          "are taken.")
        return width

    def _alternatives(self, options: list[Any], where: str) -> int:
        widths = [self.of(sub, f"{where}[{i}]") for i, sub in enumerate(options)]
        starts = [self.start(sub) for sub in options]
        # Alternatives that may be alive together form a group (linked by overlapping starts); the widest
        # group's sum is alive at once, and before the starts are read every alternative is (a literal each).
        group = list(range(len(options)))
        for i in range(len(options)):
            for j in range(i):
                if not _apart(starts[i], starts[j]):
                    old, new = group[i], group[j]
                    group = [new if g == old else g for g in group]
        sums: dict[int, int] = {}
        for g, width in zip(group, widths, strict=True):
            sums[g] = sums.get(g, 0) + width
        return max(max(sums.values()), -(-len(options) // 4))

    def _of(self, schema: dict[str, Any], where: str) -> int:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.values.get(ref, 1)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self._alternatives(schema[key], f"{where}.{key}")
        kind = schema.get("type")
        if isinstance(kind, list):  # the converter makes each a bare type
            return self._alternatives([{"type": k} for k in kind], f"{where}.type")
        widths = [1]
        if isinstance(schema.get("enum"), list):
            widths.append(-(-len(schema["enum"]) // 4))
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern in self.checked.patterns:
            if pattern not in self.patterns:
                self.patterns[pattern] = pattern_width(self.checked.patterns[pattern], f"{where}.pattern", pattern)
            widths.append(self.patterns[pattern])
        properties = schema.get("properties")
        if isinstance(properties, dict):
            required = set(schema.get("required", []))
            widths.append(sum(1 for name in properties if name not in required) + 1)
            widths += [self.of(sub, f"{where}.properties.{name}") for name, sub in properties.items()]
        for key in ("allOf", "prefixItems"):
            widths += [self.of(sub, f"{where}.{key}[{i}]") for i, sub in enumerate(schema.get(key, []))]
        items = schema.get("items")
        if isinstance(items, list):
            widths += [self.of(sub, f"{where}.items[{i}]") for i, sub in enumerate(items)]
        elif isinstance(items, dict):
            widths.append(self.of(items, f"{where}.items"))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            widths.append(self.of(extra, f"{where}.additionalProperties"))
        return max(widths)

    def start(self, schema: Any) -> Start:
        """How every answer to ``schema`` starts, in the order the converter reads its keywords."""
        if not isinstance(schema, dict):
            return None, ""
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in self.starts:
                return self.starts[ref]
            if ref in self.starting or len(self.starting) > 2 * MAX_DEPTH:
                return None, ""  # unknown: it may start like anything
            self.starting.add(ref)
            try:
                self.starts[ref] = self.start(self.checked.refs[ref])
            finally:
                self.starting.discard(ref)
            return self.starts[ref]
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return _union_start([self.start(sub) for sub in schema[key]])
        kind = schema.get("type")
        if isinstance(kind, list):
            return _union_start([_TYPE_START[k] for k in kind])
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            texts = [json.dumps(v).replace(" ", "") for v in values]
            return frozenset(t[0] for t in texts), _common_prefix(texts)
        if kind in (None, "object") and ("properties" in schema or schema.get("additionalProperties", True)
                                         is not True):
            required = set(schema.get("required", []))
            first = next((name for name in schema.get("properties", {}) if name in required), None)
            if first is None:
                return frozenset("{"), "{"
            # The first required property's key, and its value's start: a discriminator ({"kind": "circle",
            # ...}) tells the alternatives apart before anything in them nests.
            return frozenset("{"), "{" + json.dumps(first).replace(" ", "") + ":" + self.start(
                schema["properties"][first])[1]
        if kind in (None, "object") and "allOf" in schema:
            return _TYPE_START["object"]
        if kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
            return _TYPE_START["array"]
        if kind in (None, "string") and ("pattern" in schema or "format" in schema):
            return _TYPE_START["string"]
        if kind is None:
            return _TYPE_START["object"] if not schema else (None, "")
        return _TYPE_START.get(kind, (None, ""))


# --- patterns --------------------------------------------------------------------------------------------------
# A pattern is parsed into character sets (sorted, disjoint inclusive code point ranges), sequences,
# alternatives and repetitions.

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class _Node:
    kind: str  # "chars", "seq", "alt", "rep"
    chars: Ranges = ()
    items: tuple[_Node, ...] = ()
    low: int = 0
    high: int | None = None  # rep: None is unbounded


def _normal(ranges: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _UNICODE_MAX:
        out.append((start, _UNICODE_MAX))
    return tuple(out)


_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = _normal([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE: Ranges = _normal([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                          (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])
_CLASSES = {"d": _DIGIT, "D": _complement(_DIGIT), "w": _WORD, "W": _complement(_WORD), "s": _SPACE,
            "S": _complement(_SPACE)}
_CONTROL = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
_DOT: Ranges = _complement(((0x0A, 0x0A), (0x0D, 0x0D)))


def _chars(*ranges: tuple[int, int]) -> _Node:
    return _Node("chars", chars=_normal(list(ranges)))


class _PatternParser:
    def __init__(self, pattern: str, where: str) -> None:
        self.text = self.original = pattern
        self.where = where
        self.i = 0
        self.depth = 0

    def fail(self, what: str) -> SettingsError:
        return _refuse(self.where, f"({self.original[:80]!r}) {what}")

    def parse(self) -> _Node:
        text = self.text
        if not (text.startswith("^") and text.endswith("$")) or len(text) < 2 or text.endswith("\\$"):
            raise self.fail("must start with ^ and end with $: the grammar matches the whole string.")
        self.text = text[1:-1]
        node = self.alternatives()
        if self.i < len(self.text):
            raise self.fail(f"has an unmatched ')' at index {self.i + 1}.")
        return node

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def alternatives(self) -> _Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else _Node("alt", items=tuple(options))

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            atom = self.quantified(atom)
            items.append(atom)
        return items[0] if len(items) == 1 else _Node("seq", items=tuple(items))

    def quantified(self, atom: _Node) -> _Node:
        c = self.peek()
        start = self.i
        if c in ("*", "+", "?"):
            self.i += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            match = re.compile(r"\{(\d+)(,(\d*))?\}").match(self.text, self.i)
            if match is None:
                raise self.fail(f"has a '{{' at index {self.i + 1} that is not a {{m}}, {{m,}} or {{m,n}} "
                                "quantifier (write \\{ for the character).")
            self.i = match.end()
            low = int(match.group(1))
            high = low if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
            for n in (low, high):
                if n is not None and n > MAX_REPEAT:
                    raise self.fail(f"repeats {match.group(0)}: at most {MAX_REPEAT} repetitions are taken "
                                    "(llama.cpp's grammar cannot hold more).")
            if high is not None and low > high:
                raise self.fail(f"has the quantifier {match.group(0)}, whose minimum is above its maximum.")
        else:
            return atom
        if self.peek() == "?":  # lazy: the same strings match
            self.i += 1
        if self.peek() and self.peek() in "*+?{":
            raise self.fail(f"has a quantifier right after another at index {start + 1} "
                            f"({self.text[start:self.i + 1]!r}); possessive and doubled quantifiers are not "
                            "supported.")
        return _Node("rep", items=(atom,), low=low, high=high)

    def atom(self) -> _Node:
        c = self.text[self.i]
        if c == "(":
            self.i += 1
            if self.text.startswith("?", self.i):
                named = re.compile(r"\?(:|P?<[A-Za-z_][A-Za-z0-9_]*>)").match(self.text, self.i)
                if named is None:
                    raise self.fail(f"has a lookaround or other (?...) group at index {self.i}; only plain, "
                                    "(?:...) and named groups are supported.")
                self.i = named.end()
            self.depth += 1
            if self.depth > MAX_PATTERN_GROUP_DEPTH:
                raise self.fail(f"nests groups more than {MAX_PATTERN_GROUP_DEPTH} deep.")
            node = self.alternatives()
            self.depth -= 1
            if self.peek() != ")":
                raise self.fail("has an unclosed '('.")
            self.i += 1
            return node
        if c in ("*", "+", "?", "{"):
            raise self.fail(f"has a quantifier {c!r} with nothing before it at index {self.i + 1}.")
        if c in ("^", "$"):
            raise self.fail(f"has {c!r} inside it (index {self.i + 1}); only a leading ^ and a trailing $ are "
                            "supported.")
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return _Node("chars", chars=_DOT)
        if c == "\\":
            ranges = self.escape(in_class=False)
            return _Node("chars", chars=ranges)
        self.i += 1
        return _chars((ord(c), ord(c)))

    def escape(self, *, in_class: bool) -> Ranges:
        """The escape at ``self.i`` (a backslash), as a character set; advances past it."""
        self.i += 1
        if self.i >= len(self.text):
            raise self.fail("ends with a lone backslash.")
        c = self.text[self.i]
        self.i += 1
        if c in _CLASSES:
            return _CLASSES[c]
        if c in _CONTROL:
            return ((_CONTROL[c], _CONTROL[c]),)
        if c == "b" and in_class:
            return ((0x08, 0x08),)
        if c in ("x", "u"):
            digits = 2 if c == "x" else 4
            code = self.text[self.i:self.i + digits]
            if len(code) != digits or not all(ch in "0123456789abcdefABCDEF" for ch in code):
                raise self.fail(f"has \\{c} without {digits} hex digits after it.")
            self.i += digits
            return ((int(code, 16), int(code, 16)),)
        if c.isalnum() or c == "_":
            what = {"b": "word boundaries (\\b)", "B": "word boundaries (\\B)", "p": "Unicode properties (\\p)",
                    "P": "Unicode properties (\\P)", "k": "backreferences (\\k)", "c": "control escapes (\\c)"}
            named = what.get(c, "backreferences" if c.isdigit() else "the escape \\" + c)
            raise self.fail(f"uses {named}, which the grammar cannot express.")
        return ((ord(c), ord(c)),)

    def char_class(self) -> _Node:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.i >= len(self.text):
                raise self.fail("has an unclosed '['.")
            if self.text[self.i] == "]":
                self.i += 1
                break
            lo_set = self.class_atom()
            if self.peek() == "-" and self.i + 1 < len(self.text) and self.text[self.i + 1] != "]":
                self.i += 1
                hi_set = self.class_atom()
                if len(lo_set) != 1 or len(hi_set) != 1 or lo_set[0][0] != lo_set[0][1] \
                        or hi_set[0][0] != hi_set[0][1]:
                    raise self.fail("has a range in [...] whose end is a class such as \\d.")
                lo, hi = lo_set[0][0], hi_set[0][0]
                if lo > hi:
                    raise self.fail(f"has the range {chr(lo)!r}-{chr(hi)!r} in [...], out of order.")
                ranges.append((lo, hi))
            else:
                ranges.extend(lo_set)
        normal = _normal(ranges)
        chars = _complement(normal) if negated else normal
        if not chars:
            raise self.fail("has a character class that matches no character.")
        return _Node("chars", chars=chars)

    def class_atom(self) -> Ranges:
        if self.text[self.i] == "\\":
            return self.escape(in_class=True)
        c = self.text[self.i]
        self.i += 1
        return ((ord(c), ord(c)),)


def parse_pattern(pattern: str, where: str = "pattern") -> _Node:
    """``pattern`` (ECMAScript syntax, anchored) as a tree; SettingsError names what it cannot express."""
    node = _PatternParser(pattern, where).parse()
    positions = _positions(node)
    if positions > MAX_PATTERN_POSITIONS:
        raise _refuse(where, f"({pattern[:80]!r}) expands to {positions} positions once its counts are written "
                      f"out (a quantified group that contains a quantifier multiplies them); at most "
                      f"{MAX_PATTERN_POSITIONS} are taken.")
    return node


def _positions(node: _Node) -> int:
    """How many atoms the grammar holds for ``node``: a count n makes n copies, + makes two (x x*)."""
    if node.kind == "chars":
        return 1
    if node.kind in ("seq", "alt"):
        return sum(_positions(item) for item in node.items)
    inner = _positions(node.items[0])
    copies = node.low + 1 if node.high is None else max(node.high, 1)
    return inner * copies


def _repeat_text(node: _Node, name_len: int) -> int:
    """About how much grammar text the counts of a pattern write (each copy names its sub-rule)."""
    if node.kind == "chars":
        return 0
    if node.kind in ("seq", "alt"):
        return sum(_repeat_text(item, name_len) for item in node.items)
    inner = _repeat_text(node.items[0], name_len)
    count = node.low if node.high is None else node.high
    return inner + count * (name_len + 8)


class _Glushkov:
    """Positions of the pattern written out as the grammar writes it, and what may follow each."""

    def __init__(self, work: list[int], where: str) -> None:
        self.follow: list[int] = []
        self.atoms: dict[Ranges, int] = {}  # a character set: the positions that read it
        self.work = work
        self.where = where

    def position(self, chars: Ranges) -> int:
        p = len(self.follow)
        self.follow.append(0)
        self.atoms[chars] = self.atoms.get(chars, 0) | (1 << p)
        return 1 << p

    def link(self, last: int, first: int) -> None:
        if not first:
            return
        for p in _bits(last):
            self.follow[p] |= first
            self.work[0] += 1
        if self.work[0] > MAX_PATTERN_WORK:
            raise _too_complex(self.where)

    def build(self, node: _Node) -> tuple[int, int, bool]:
        """(first positions, last positions, matches empty) of ``node``, linking its insides."""
        if node.kind == "chars":
            p = self.position(node.chars)
            return p, p, False
        if node.kind == "alt":
            first = last = 0
            empty = False
            for item in node.items:
                f, la, e = self.build(item)
                first, last, empty = first | f, last | la, empty or e
            return first, last, empty
        if node.kind == "seq":
            return self.sequence([lambda item=item: self.build(item) for item in node.items])
        item = node.items[0]
        parts = [lambda: self.build(item)] * node.low
        if node.high is None:
            parts.append(lambda: self.star(item))
        elif node.high > node.low:
            extra = node.high - node.low
            parts.append(lambda: self.nested_optional(item, extra))
        if not parts:
            return 0, 0, True
        return self.sequence(parts)

    def sequence(self, parts: list[Any]) -> tuple[int, int, bool]:
        first = last = 0
        empty = True
        for part in parts:
            f, la, e = part()
            self.link(last, f)
            if empty:
                first |= f
            last = (last | la) if e else la
            empty = empty and e
        return first, last, empty

    def star(self, item: _Node) -> tuple[int, int, bool]:
        f, la, _ = self.build(item)
        self.link(la, f)
        return f, la, True

    def nested_optional(self, item: _Node, n: int) -> tuple[int, int, bool]:
        """(x (x (x)?)?)? with n copies: each copy may follow the one before it."""
        first, previous, last = 0, 0, 0
        leading_empty = True
        for k in range(n):
            f, la, e = self.build(item)
            if leading_empty:
                first |= f
            if k:
                self.link(previous, f)
            previous = (previous | la) if e else la
            last |= la
            leading_empty = leading_empty and e
        return first, last, True


def _bits(value: int) -> Iterator[int]:
    while value:
        low = value & -value
        yield low.bit_length() - 1
        value ^= low


def pattern_width(node: _Node, where: str = "pattern", text: str = "") -> int:
    """The most positions of the pattern alive after any input (llama.cpp's parse stacks for it)."""
    work = [0]
    graph = _Glushkov(work, where)
    first, _, _ = graph.build(node)
    # Characters told apart by the pattern: between two boundaries of its sets every character reads the same
    # positions. A sweep over the boundaries toggles each set's positions on at its ranges' starts and off after
    # their ends.
    toggles: dict[int, int] = {}
    for chars, positions in graph.atoms.items():
        for lo, hi in chars:
            toggles[lo] = toggles.get(lo, 0) ^ positions
            toggles[hi + 1] = toggles.get(hi + 1, 0) ^ positions
    cells, current = set(), 0
    for bound in sorted(toggles):
        current ^= toggles[bound]
        cells.add(current)
        work[0] += 1
    masks = sorted(cells - {0})
    widest = first.bit_count()
    seen = {first}
    todo = [first]
    while todo:
        alive = todo.pop()
        widest = max(widest, alive.bit_count())
        if widest > MAX_WIDTH:
            shown = f"({text[:80]!r}) " if text else ""
            raise _refuse(where, f"{shown}can have more than {MAX_WIDTH} of its positions alive at once (one string "
                          "matches it in many ways: quantified groups that contain quantifiers, or repeated "
                          f"parts that can match the same text); at most {MAX_WIDTH} are taken.")
        for mask in masks:
            read = alive & mask
            work[0] += 1
            if not read:
                continue
            after = 0
            for p in _bits(read):
                after |= graph.follow[p]
                work[0] += 1
            if after and after not in seen:
                seen.add(after)
                todo.append(after)
        if work[0] > MAX_PATTERN_WORK:
            raise _too_complex(where)
    return widest


def _too_complex(where: str) -> SettingsError:
    return _refuse(where, "is too complex to check within the grammar's bounds; simplify it.")


# --- GBNF ------------------------------------------------------------------------------------------------------

_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
_JSON_SAFE: Ranges = _complement(((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))


def _gbnf_literal(text: str) -> str:
    out = []
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F or (code > 0x9F and ch.isprintable()):
            out.append(ch)
        else:
            out.append(_hex(code))
    return '"' + "".join(out) + '"'


def _hex(code: int) -> str:
    return f"\\x{code:02X}" if code <= 0xFF else f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def _class_char(code: int) -> str:
    return chr(code) if chr(code).isascii() and chr(code).isalnum() else _hex(code)


def _json_text(code: int) -> str:
    """The JSON string text that stands for the character ``code``."""
    if code in _JSON_ESCAPES:
        return _JSON_ESCAPES[code]
    return f"\\u{code:04x}" if code < 0x20 else chr(code)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _gbnf_chars(chars: Ranges) -> tuple[str, bool]:
    """GBNF for one character of the set as JSON string text: (text, is a single literal). The characters a JSON
    string escapes are written escaped, all of them behind one backslash (one parse stack, not one each)."""
    if len(chars) == 1 and chars[0][0] == chars[0][1]:
        return _gbnf_literal(_json_text(chars[0][0])), True
    options = []
    safe = _intersect(chars, _JSON_SAFE)
    if safe == _JSON_SAFE:
        options.append('[^"\\\\\\x00-\\x1F]')
    elif safe:
        options.append("[" + "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
                                     for lo, hi in safe) + "]")
    escaped = [code for lo, hi in _intersect(chars, _complement(_JSON_SAFE)) for code in range(lo, hi + 1)]
    if escaped:
        after = []
        short = sorted(_JSON_ESCAPES[code][1] for code in escaped if code in _JSON_ESCAPES)
        if short:
            after.append("[" + "".join(_class_char(ord(ch)) for ch in short) + "]")
        digits: dict[int, set[str]] = {}
        for code in escaped:
            if code not in _JSON_ESCAPES:
                digit = "0123456789abcdef"[code & 15]
                digits.setdefault(code >> 4, set()).update((digit, digit.upper()))
        if digits:
            groups = [f'"{high}" [' + "".join(sorted(d)) + "]" for high, d in sorted(digits.items())]
            after.append('"u00" ' + (groups[0] if len(groups) == 1 else "(" + " | ".join(groups) + ")"))
        options.append('"\\\\" ' + (after[0] if len(after) == 1 else "(" + " | ".join(after) + ")"))
    if len(options) == 1:
        return options[0], False
    return "(" + " | ".join(options) + ")", False


class _PatternWriter:
    """A parsed pattern as GBNF, shaped as llama-cpp-python's converter shapes it (a count's item becomes a
    sub-rule, written n times), so the bounds above describe it."""

    def __init__(self, converter: Any, name: str) -> None:
        self.converter = converter
        self.name = name
        self.subrules: dict[str, str] = {}

    def write(self, node: _Node) -> tuple[str, bool]:
        """(GBNF, is a single literal) for ``node``."""
        if node.kind == "chars":
            return _gbnf_chars(node.chars)
        if node.kind == "alt":
            return "(" + " | ".join(self.write(item)[0] for item in node.items) + ")", False
        if node.kind == "seq":
            parts: list[tuple[str, bool]] = []
            for item in node.items:
                text, literal = self.write(item)
                if literal and parts and parts[-1][1]:
                    parts[-1] = (parts[-1][0][:-1] + text[1:], True)
                else:
                    parts.append((text, literal))
            if not parts:
                return '""', True
            if len(parts) == 1:
                return parts[0]
            return "(" + " ".join(text for text, _ in parts) + ")", False
        text, literal = self.write(node.items[0])
        if node.items[0].kind == "rep":
            text = "(" + text + ")"
        simple = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((node.low, node.high))
        if simple:
            return text + simple, False
        if not literal:
            sub = self.subrules.get(text)
            if sub is None:
                sub = self.converter._add_rule(f"{self.name}-{len(self.subrules) + 1}", text)
                self.subrules[text] = sub
            text = sub
        built = _llama_grammar()._build_repetition(text, node.low, node.high, item_rule_is_literal=literal)
        return "(" + str(built) + ")", False


_PLACEHOLDER = "\x00reserved"


def _llama_grammar() -> Any:
    """llama-cpp-python's converter module (untyped; imported when a grammar is made, as it loads llama.cpp)."""
    import importlib

    return importlib.import_module("llama_cpp.llama_grammar")


# llama-cpp-python's string character rule lets raw newlines and other control characters into a string, which
# no JSON parser accepts; llama.cpp's own converter excludes them, as this does.
_LOOSE_CHAR = r'[^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def _convert(checked: CheckedSchema) -> str:
    lg = _llama_grammar()
    invalid_rule_chars = lg.INVALID_RULE_CHARS_RE
    base: Any = lg.SchemaConverter

    class Converter(base):  # type: ignore[misc]
        """llama-cpp-python's converter with references resolved from ``checked.refs`` (the root and
        recursive ones too), each under a rule name of its own, and patterns written by ``_PatternWriter``."""

        def __init__(self) -> None:
            super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            self._refs = dict(checked.refs)
            self._ref_rules: dict[str, str] = {}

        def resolve_refs(self, schema: Any, url: str) -> Any:
            return schema

        def _add_rule(self, name: str, rule: str) -> str:
            key = str(invalid_rule_chars.sub("-", name))
            if key == "char" and rule == _LOOSE_CHAR:  # JSON strings hold no raw control characters
                rule = _JSON_CHAR
            if self._rules.get(key) == _PLACEHOLDER:
                self._rules[key] = rule
                return key
            return str(super()._add_rule(name, rule))

        def _resolve_ref(self, ref: str) -> str:
            rule = self._ref_rules.get(ref)
            if rule is None:
                base = "ref-" + (invalid_rule_chars.sub("-", ref.rsplit("/", 1)[-1]).strip("-") or "root")
                rule, i = base, 0
                while rule in self._rules:
                    i += 1
                    rule = f"{base}{i}"
                self._rules[rule] = _PLACEHOLDER
                self._ref_rules[ref] = rule
                body = self.visit(self._refs[ref], rule)
                if self._rules[rule] == _PLACEHOLDER:
                    self._rules[rule] = body
            return rule

        def _visit_pattern(self, pattern: str, name: str) -> str:
            node = checked.patterns.get(pattern) or parse_pattern(pattern)
            body, _ = _PatternWriter(self, name).write(node)
            return str(self._add_rule(name, '"\\"" ' + body + ' "\\"" space'))

    converter = Converter()
    converter.visit(checked.schema, "")
    return str(converter.format_grammar())
