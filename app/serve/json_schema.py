"""The JSON Schema subset a grammar can enforce: a schema that leaves it is refused by name, never loosened.

Used for ``response_format`` and for the parameters of tools whose calls are forced.
"""

from __future__ import annotations

from typing import Any

# --- response_format -------------------------------------------------------------------------------------
# The JSON Schema keywords llama.cpp's schema-to-grammar converter turns into grammar rules. Anything else would
# be ignored by it, so the output could break the schema: such a schema is refused by name instead.
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format", "minLength",
    "maxLength", "title", "description", "default", "examples", "$schema", "$id", "$comment",
})
SCHEMA_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
SCHEMA_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
SCHEMA_MAX_DEPTH = 64


def unsupported_in_schema(schema: Any, where: str, depth: int = 0) -> str | None:
    """Where the schema leaves the supported subset, in words; None when it stays inside it."""
    if depth > SCHEMA_MAX_DEPTH:
        return f"{where} is nested more than {SCHEMA_MAX_DEPTH} deep"
    if isinstance(schema, bool):
        return None if schema else f"{where} is false (nothing matches it)"
    if not isinstance(schema, dict):
        return f"{where} is not a schema object"
    for key, value in schema.items():
        here = f"{where}.{key}"
        if key not in SCHEMA_KEYWORDS:
            return f"the keyword '{key}' (at {where})"
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            odd = [k for k in kinds if k not in SCHEMA_TYPES]
            if odd:
                return f"the type {odd[0]!r} (at {here})"
        elif key == "format" and value not in SCHEMA_FORMATS:
            return f"the format {str(value)[:40]!r} (at {here}); supported: {', '.join(sorted(SCHEMA_FORMATS))}"
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            return f"the reference {str(value)[:80]!r} (at {here}); only references inside the schema are"
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                return f"{here} is not an object"
            for name, sub in value.items():
                found = unsupported_in_schema(sub, f"{here}.{name}", depth + 1)
                if found:
                    return found
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") or (key == "items" and isinstance(value, list)):
            if not isinstance(value, list) or not value:
                return f"{here} is not a non-empty list"
            for i, sub in enumerate(value):
                found = unsupported_in_schema(sub, f"{here}[{i}]", depth + 1)
                if found:
                    return found
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            found = unsupported_in_schema(value, here, depth + 1)
            if found:
                return found
    return None
