"""prometheus-operator custom resources checked against their published CRDs (tests/fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def undeclared_fields(schema: dict[str, Any], value: Any, path: str = "$") -> Iterator[str]:
    """Fields the schema does not declare. CRD schemas leave additionalProperties unset (the API server prunes
    unknown fields instead of refusing them), so JSON Schema validation alone accepts a misspelt field."""
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if props is not None and key in props:
                yield from undeclared_fields(props[key], sub, f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from undeclared_fields(extra, sub, f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            yield from undeclared_fields(schema["items"], sub, f"{path}[{i}]")
