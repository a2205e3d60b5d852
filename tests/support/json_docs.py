"""Walking a JSON document key by key, for the tests that hand every reader of a file a real
sample with one key changed (tests/records/test_json_readers.py, tests/runner/
test_outcome_node_json.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

GONE = object()  # as a value: the key removed


def key_paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every key's path in a document (a list's first item stands for the others)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from key_paths(item, (*path, key))
    elif isinstance(value, list) and value:
        yield from key_paths(value[0], (*path, 0))


def with_value(doc: Any, path: tuple, value: Any) -> Any:
    """A copy of DOC whose key at PATH holds VALUE (GONE: the key removed)."""
    doc = json.loads(json.dumps(doc))
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    if value is GONE:
        del node[last]
    else:
        node[last] = value
    return doc
