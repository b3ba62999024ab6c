"""A JSON schema is bounded before llama.cpp's grammar parser and sampler see it (app.engine.schema_limits).

Each hostile schema is refused with a SettingsError naming the keyword and where it is, through grammar_text
(every path to a grammar) and through the server's request parser (a 400). The old code's fate for each is shown
too: the crashers and the hang in a child process (a crash there cannot take the test process down), the rest in
process. Legitimate schemas (nested objects, arrays with maxItems, enums, $defs references, patterns) still make
grammars that llama.cpp accepts and that match a sample answer token by token.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.engine import schema_limits
from app.engine.grammar import grammar_text
from app.errors import SettingsError
from app.serve import protocol
from app.serve.api_error import ApiError
from app.serve.json_schema import unsupported_in_schema
from app.serve.protocol import Limits
from tests.app.test_serve import MESSAGES, start_server

ROOT = Path(__file__).resolve().parents[2]

NESTED_QUANTIFIERS = {"type": "string", "pattern": "^((((a{0,30}){0,30}){0,30}){0,30})$"}
# Two alternatives that both start with "[" and both hold the schema again: after n "[" there are 2^n parse stacks.
ALIKE_RECURSION = {"type": "object", "properties": {"x": {"$ref": "#/$defs/r"}}, "required": ["x"], "$defs": {"r": {
    "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/r"}},
              {"type": "array", "prefixItems": [{"$ref": "#/$defs/r"}]}, {"type": "integer"}]}}}
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "nested-quantifiers": (NESTED_QUANTIFIERS, "schema.pattern"),
    "nested-quantifiers-small": ({"type": "string", "pattern": "^((a{0,30}){0,30})$"}, "schema.pattern"),
    "ambiguous-neighbours": ({"type": "string", "pattern": "^[a-z]{0,100}[a-z]{0,100}$"}, "schema.pattern"),
    "maxItems-1e5": ({"type": "array", "items": {"type": "integer"}, "maxItems": 100000}, "schema.maxItems"),
    "maxLength-1e5": ({"type": "string", "maxLength": 100000}, "schema.maxLength"),
    "pattern-count-1e5": ({"type": "string", "pattern": "^a{0,100000}$"}, "schema.pattern"),
    "minItems-1e9": ({"type": "array", "items": {"type": "integer"}, "minItems": 10**9}, "schema.minItems"),
    "minItems-float": ({"type": "array", "items": {"type": "integer"}, "minItems": 2.5}, "schema.minItems"),
    "minItems-string": ({"type": "array", "items": {"type": "integer"}, "minItems": "3"}, "schema.minItems"),
    "minItems-negative": ({"type": "array", "items": {"type": "integer"}, "minItems": -1}, "schema.minItems"),
    "minItems-above-maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 2},
                                "schema.minItems"),
    "minLength-above-maxLength": ({"type": "string", "minLength": 5, "maxLength": 2}, "schema.minLength"),
    "maxLength-bool": ({"type": "string", "maxLength": True}, "schema.maxLength"),
    "nested-maxLength": ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5000}}},
                         "schema.properties.a.maxLength"),
    "pattern-number": ({"type": "string", "pattern": 5}, "schema.pattern"),
    "type-list-of-lists": ({"type": [["string"]]}, "schema.type"),
    "type-object": ({"type": {"a": 1}}, "schema.type"),
    "format-list": ({"type": "string", "format": ["date"]}, "schema.format"),
    "remote-ref": ({"$ref": "https://example.com/schema.json"}, "https://example.com/schema.json"),
    "dangling-ref": ({"$ref": "#/$defs/missing", "$defs": {}}, "#/$defs/missing"),
    "exponential-union": ({"$ref": "#/$defs/d8", "$defs": {
        "d0": {"type": "integer"},
        **{f"d{k + 1}": {"anyOf": [{"type": "array", "items": {"$ref": f"#/$defs/d{k}"}},
                                   {"type": "array", "prefixItems": [{"$ref": f"#/$defs/d{k}"}]}]}
           for k in range(8)}}}, "schema.$defs.d"),
    "recursion-through-alike-alternatives": (ALIKE_RECURSION, "refers back to itself"),
    "enum-1024": ({"enum": [f"item{i:04d}" for i in range(1024)]}, "schema.enum"),
    "optional-properties-100": ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(100)}},
                                "schema.properties"),
    "lookahead": ({"type": "string", "pattern": "^(?=a)a$"}, "schema.pattern"),
    "backreference": ({"type": "string", "pattern": "^(a)\\1$"}, "schema.pattern"),
    "unanchored": ({"type": "string", "pattern": "abc"}, "schema.pattern"),
    "deep": (json.loads('{"type": "array", "items": ' * 70 + "{}" + "}" * 70), "nested more than 64"),
    "grammar-too-large": ({"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 1000}
                                                           for i in range(40)}}, "KiB"),
}


@pytest.mark.parametrize(("schema", "named"), HOSTILE.values(), ids=HOSTILE.keys())
def test_each_hostile_schema_is_refused_by_name(schema: dict[str, Any], named: str) -> None:
    started = time.monotonic()
    with pytest.raises(SettingsError) as caught:
        grammar_text(json.dumps(schema))
    assert named in str(caught.value)
    assert time.monotonic() - started < 30  # refused, not worked through (generous: a loaded machine)


@pytest.mark.parametrize(("schema", "named"), HOSTILE.values(), ids=HOSTILE.keys())
def test_the_server_refuses_each_with_a_400_naming_it(schema: dict[str, Any], named: str) -> None:
    body = {"messages": MESSAGES, "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "s", "schema": schema}}}
    with pytest.raises(ApiError) as caught:
        protocol.parse_request(body, Limits(), chat=True)
    assert caught.value.status == 400
    assert caught.value.param == "response_format"
    assert named in caught.value.message


# --- what the old code did with them -------------------------------------------------------------------------

def _old_grammar_text(response_format: str) -> str:
    """grammar_text as it was: llama-cpp-python's converter with no bounds."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(response_format))
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SettingsError(f"The JSON schema cannot be turned into a grammar: {exc}") from None


# A child that makes the grammar ("old": the bare converter, "new": grammar_text), builds llama.cpp's grammar
# sampler on a model's vocabulary and feeds it each case's text one token at a time (llama_sampler_apply, then
# accept). It prints one JSON line per stage, so a crash or a hang shows how far it got.
CHILD = r"""
import ctypes, json, resource, sys
import numpy as np
import llama_cpp as lc

model_path, mode, memory = sys.argv[1], sys.argv[2], int(sys.argv[3])
if memory:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
quiet = lc.llama_log_callback(lambda *a: None)
lc.llama_log_set(quiet, ctypes.c_void_p(0))
params = lc.llama_model_default_params()
params.vocab_only = True
model = lc.llama_model_load_from_file(model_path.encode(), params)
vocab = lc.llama_model_get_vocab(model)
n = lc.llama_vocab_n_tokens(vocab)
rows = np.zeros(n, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
rows["id"] = np.arange(n)
for case in json.loads(sys.stdin.read()):
    if mode == "old":
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        text = json_schema_to_gbnf(json.dumps(case["schema"]))
    else:
        from app.engine.grammar import grammar_text
        text = grammar_text(json.dumps(case["schema"]))
    print(json.dumps({"stage": "grammar", "bytes": len(text)}), flush=True)
    sampler = lc.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    print(json.dumps({"stage": "sampler", "ok": bool(sampler)}), flush=True)
    if not sampler:
        continue
    answer = case["text"].encode()
    tokens = (ctypes.c_int32 * (len(answer) + 8))()
    count = lc.llama_tokenize(vocab, answer, len(answer), tokens, len(answer) + 8, False, False)
    matched = True
    for token in tokens[:count]:
        rows["logit"] = 0.0
        array = lc.llama_token_data_array(data=rows.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=n,
                                          selected=-1, sorted=False)
        lc.llama_sampler_apply(sampler, ctypes.byref(array))
        if rows["logit"][token] == -np.inf:
            matched = False
            break
        lc.llama_sampler_accept(sampler, token)
    lc.llama_sampler_free(sampler)
    print(json.dumps({"stage": "done", "matched": matched}), flush=True)
"""


def _child(model: Path, mode: str, cases: list[dict[str, Any]], *, timeout: float,
           memory: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, str(model), mode, str(memory)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _stages(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 100000},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 100000},
    {"type": "string", "pattern": "^a{0,100000}$"},
], ids=["maxLength", "maxItems", "pattern-count"])
def test_the_old_code_crashed_the_process_on_a_huge_count(tiny_target: Path, schema: dict[str, Any]) -> None:
    """llama.cpp's parser overflows its stack on 10^5 nested groups: SIGSEGV, the worker gone."""
    done = _child(tiny_target, "old", [{"schema": schema, "text": '"'}], timeout=60)
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stdout, done.stderr[-2000:])
    assert [stage["stage"] for stage in _stages(done)] == ["grammar"]  # it died in the parser


@pytest.mark.slow
@pytest.mark.parametrize(("schema", "text"), [
    (NESTED_QUANTIFIERS, '"' + "a" * 40 + '"'),
    (ALIKE_RECURSION, '{"x": ' + "[" * 40),
], ids=["nested-quantifiers", "recursion-through-alike-alternatives"])
def test_the_old_code_hung_in_the_sampler(tiny_target: Path, schema: dict[str, Any], text: str) -> None:
    """The grammar is a kilobyte and llama.cpp takes it, but 40 sampling steps do not end: 20 s is many times
    what whole answers under sane grammars take (the test below feeds a dozen of them in well under that)."""
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _child(tiny_target, "old", [{"schema": schema, "text": text}], timeout=20)
    out = caught.value.stdout
    printed = out.decode() if isinstance(out, bytes) else (out or "")
    assert '"stage": "sampler", "ok": true' in printed  # it got as far as sampling
    assert '"stage": "done"' not in printed


def test_the_old_code_asked_for_gigabytes_on_a_huge_minimum(tiny_target: Path) -> None:
    """minItems 10^9 is 10^9 copies of the item side by side (about 50 GB of text): under a 2 GiB address
    space the old converter dies of a MemoryError, which nothing caught (a 500, or a dead worker)."""
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 10**9}
    done = _child(tiny_target, "old", [{"schema": schema, "text": "["}], timeout=120, memory=2 << 30)
    assert done.returncode != 0
    assert "MemoryError" in done.stderr
    assert _stages(done) == []


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 2},
    {"type": "string", "minLength": 5, "maxLength": 2},
    {"type": "array", "items": {"type": "integer"}, "minItems": -1, "maxItems": 2},
    {"type": "string", "maxLength": True},
], ids=["minItems-above-maxItems", "minLength-above-maxLength", "negative", "bool"])
def test_the_old_code_made_a_grammar_that_ignored_a_bad_count(schema: dict[str, Any]) -> None:
    assert "root ::=" in _old_grammar_text(json.dumps(schema))


def test_the_old_code_failed_with_a_traceback_on_a_wrong_type() -> None:
    """Errors nothing caught: a 500 with a traceback instead of a 400."""
    with pytest.raises(AttributeError):
        _old_grammar_text(json.dumps({"type": "string", "pattern": 5}))
    with pytest.raises(TypeError):  # the server's keyword check, which now runs after the types are checked
        unsupported_in_schema({"type": [["string"]]}, "schema")


def test_the_old_code_refused_a_reference_from_the_root() -> None:
    recursive = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    with pytest.raises(SettingsError, match="node"):
        _old_grammar_text(json.dumps(recursive))
    assert "ref-node ::=" in grammar_text(json.dumps(recursive))


# --- what still works ----------------------------------------------------------------------------------------

NODE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#/$defs/tree_node"},
                                                      "maxItems": 5}},
        "required": ["value"]}
LEGITIMATE: dict[str, tuple[dict[str, Any], str]] = {
    "nested-objects": ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                  "age": {"type": "integer"}}, "required": ["name", "age"]},
        "active": {"type": "boolean"}}, "required": ["user"], "additionalProperties": False},
        '{"user": {"name": "Ann", "age": 41}, "active": true}'),
    "array-maxItems-50": ({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 50},
                          "[" + ", ".join(str(i / 4) for i in range(50)) + "]"),
    "enum": ({"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue", None, 3]}},
              "required": ["colour"]}, '{"colour": "green"}'),
    "defs-ref": ({"type": "object", "properties": {"home": {"$ref": "#/$defs/address"},
                                                   "work": {"$ref": "#/$defs/address"}},
                  "required": ["home"], "$defs": {"address": {
                      "type": "object", "properties": {"street": {"type": "string"}, "zip": {
                          "type": "string", "pattern": "^\\d{5}$"}}, "required": ["street", "zip"]}}},
                 '{"home": {"street": "Main St 1", "zip": "12345"}, "work": {"street": "Elm", "zip": "54321"}}'),
    "root-ref-recursive": ({"$ref": "#/$defs/tree_node", "$defs": {"tree_node": NODE}},
                           '{"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}'),
    "definitions-ref": ({"type": "array", "items": {"$ref": "#/definitions/point"}, "maxItems": 3,
                         "definitions": {"point": {"type": "array", "prefixItems": [{"type": "number"},
                                                                                    {"type": "number"}]}}},
                        "[[1, 2], [3.5, -4]]"),
    "email-pattern": ({"type": "string", "pattern": "^[a-z]{1,20}@[a-z]+\\.com$"}, '"ann@example.com"'),
    "hostname-pattern": ({"type": "string", "pattern": "^([a-z0-9]+\\.)+[a-z]{2,}$"}, '"www.example.org"'),
    "date-pattern": ({"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}, '"2024-02-29"'),
    "escapes-in-pattern": ({"type": "string", "pattern": '^say "[^"]*"\\.$'}, '"say \\"hi\\"."'),
    "anyOf": ({"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer"}, {"type": "null"}]}, "null"),
    "recursive-tagged-union": ({"$ref": "#/$defs/expr", "$defs": {
        "expr": {"anyOf": [{"$ref": f"#/$defs/{op}"} for op in ("add", "mul", "num")]},
        **{op: {"type": "object", "properties": {"op": {"const": op}, "args": {
            "type": "array", "items": {"$ref": "#/$defs/expr"}}}, "required": ["op", "args"]} for op in ("add", "mul")},
        "num": {"type": "object", "properties": {"op": {"const": "num"}, "value": {"type": "number"}},
                "required": ["op", "value"]}}},
        '{"op": "add", "args": [{"op": "num", "value": 1}, {"op": "mul", "args": [{"op": "num", "value": 2}]}]}'),
    "recursive-json-value": ({"$ref": "#/$defs/v", "$defs": {"v": {"anyOf": [
        {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": "#/$defs/v"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}}]}}},
        '{"a": [[[[1, "x", null]]], {"b": true}]}'),
    "pydantic-optional-self": ({"$defs": {"Item": {"properties": {"name": {"type": "string"}, "sub": {
        "anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}], "default": None}}, "required": ["name"],
        "title": "Item", "type": "object"}}, "$ref": "#/$defs/Item"},
        '{"name": "a", "sub": {"name": "b", "sub": null}}'),
    "at-the-bounds": ({"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 1000}, "list": {"type": "array", "items": {"type": "integer"},
                                                               "maxItems": 1000},
        "code": {"type": "string", "pattern": "^[A-Z]{0,1000}$"}, "pick": {"enum": list(range(256))}},
        "required": ["text", "list", "code", "pick"]}, '{"text": "ok", "list": [1, 2], "code": "AB", "pick": 7}'),
}


def test_legitimate_schemas_make_grammars_llama_cpp_accepts(tiny_target: Path) -> None:
    cases = [{"schema": schema, "text": text} for schema, text in LEGITIMATE.values()]
    done = _child(tiny_target, "new", cases, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = [s for s in _stages(done) if s["stage"] != "grammar"]
    assert len(outcomes) == 2 * len(cases)
    for name, sampler, fed in zip(LEGITIMATE, outcomes[::2], outcomes[1::2], strict=True):
        assert sampler == {"stage": "sampler", "ok": True}, name
        assert fed == {"stage": "done", "matched": True}, name


def test_the_same_shapes_past_the_bounds_are_refused() -> None:
    for schema in ({"type": "string", "maxLength": 1001}, {"type": "string", "pattern": "^[A-Z]{0,1001}$"},
                   {"type": "array", "items": {}, "minItems": 1001}, {"enum": list(range(257))}):
        with pytest.raises(SettingsError):
            grammar_text(json.dumps(schema))


@pytest.mark.parametrize(("pattern", "width"), [
    ("^[a-z]{1,1000}$", 1),
    ("^[a-z]{1,20}@[a-z]+\\.com$", 2),
    ("^([a-z0-9]+\\.)+[a-z]{2,}$", 3),
    ("^(a{0,8}){0,8}$", 57),  # the ambiguous shape, at the size the bound still takes
    ("^((((a+)+)+)+)+$", 31),  # each + is two copies in llama.cpp (x x*)
])
def test_a_patterns_width_counts_the_positions_alive_at_once(pattern: str, width: int) -> None:
    assert schema_limits.pattern_width(schema_limits.parse_pattern(pattern)) == width


def test_a_pattern_is_written_as_json_string_text() -> None:
    """A quote or backslash the pattern allows is written escaped, as the JSON string must hold it."""
    text = grammar_text(json.dumps({"type": "string", "pattern": '^a"\\\\.$'}))
    assert '"a\\\\\\"\\\\\\\\"' in text  # a, then \" and \\ as JSON text
    assert "[\\x22\\x5Cbft]" in text  # "." takes every escape but \\n and \\r (it excludes newlines)


# --- through the server -----------------------------------------------------------------------------------------

@pytest.mark.server
def test_a_hostile_schema_is_a_400_and_the_server_keeps_answering(tiny_target: Path, tmp_path: Path) -> None:
    server = start_server(tiny_target, tmp_path / "history.sqlite3")
    try:
        url = server.base_url + "/v1/chat/completions"
        for schema, named in (HOSTILE["nested-quantifiers"], HOSTILE["maxLength-1e5"], HOSTILE["pattern-number"]):
            r = httpx.post(url, timeout=60, json={
                "messages": MESSAGES, "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
            assert r.status_code == 400, r.text
            assert named in r.json()["error"]["message"]
            assert r.json()["error"]["param"] == "response_format"
            assert httpx.get(server.base_url + "/health", timeout=30).status_code == 200
        schema = {"type": "object", "properties": {"answer": {"$ref": "#/$defs/yes_no"}}, "required": ["answer"],
                  "additionalProperties": False, "$defs": {"yes_no": {"enum": ["yes", "no"]}}}
        r = httpx.post(url, timeout=120, json={
            "messages": MESSAGES, "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            assert json.loads(choice["message"]["content"])["answer"] in ("yes", "no")
        else:
            assert choice["message"]["content"].startswith('{')
    finally:
        server.stop()
