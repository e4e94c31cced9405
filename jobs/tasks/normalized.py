"""A task's arguments and results as JSON values: Django's `normalize_json`, refusing keys that
become one.

Owns: `normalized()`, which reads a value as `django.utils.json.normalize_json` does (a Mapping
as a dict, bytes decoded as UTF-8, any other Sequence as a list; the same TypeError or
ValueError for what it cannot hold) but raises jobs.InvalidPayload where two keys of one Mapping
normalize to one key (b"k" and "k"; 1 and True in a Mapping that is not a dict) -- Django's
keeps the last value silently. Keys that differ in Python but not once written as JSON (1 and
"1") are refused by the payload's own check (jobs.core.bounds). Never: writes, or bounds size or
depth (jobs.core.bounds does, on the value returned). Hazards: recursive as Django's is: a value
nested past Python's limit, or a cycle, raises RecursionError, which its callers turn into
their own error.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from django.utils.json import normalize_json

from jobs.core import bounds


def normalized(value: Any, what: str) -> Any:
    """`normalize_json(value)`, each Mapping's items read once; InvalidPayload (naming `what`)
    for two keys of one Mapping that normalize to one."""
    match value:
        case Mapping():
            out: dict[Any, Any] = {}
            first: dict[Any, Any] = {}
            for key, item in value.items():
                k = normalize_json(key)
                if k in out:
                    raise bounds.same_key(first[k], key, bounds.json_key(k), what)
                out[k], first[k] = normalized(item, what), key
            return out
        case bytes() | str() | int() | float() | bool() | None:
            return normalize_json(value)
        case Sequence():
            return [normalized(item, what) for item in value]
        case _:
            return normalize_json(value)  # raises TypeError, as Django's does
