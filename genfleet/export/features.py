"""The Hugging Face `datasets` features of the lines an export writes, inferred from every line.

The dataset card declares them (`dataset_info.features`) so that `datasets.load_dataset(<export>)`
reads every line whatever its shape. Left to itself, the JSON loader (datasets 5.2.0,
`packaged_modules/json/json.py` `_split_generators`) infers the features from the first block of
the first file and casts every later block to them: a key first seen later (`reasoning_content`,
which only generated turns with reasoning carry; a prompt message's `name`) or a column null at first
and text later makes the load fail. Inferred here from every line written, they cover them all.

Types follow `datasets`: `string`, `int64`, `float64`, `bool`, `null` (never anything but null), a
struct of named fields (a field missing from a line is null there), a list of one item type. Ints
and floats in one place widen to `float64`; any other mix (a string here, an object there) becomes
`json`, datasets' `Json` feature (datasets 5.2.0 `features/features.py`: kept as JSON text, given
back as the value). The whole line is always a struct: its fields are the columns.

Cost: a walk over each line's objects, and a single `set(map(type, ...))` over a list of scalars
(token ids), so a line costs a few microseconds whatever its length.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Union

NULL, BOOL, INT, FLOAT, STRING, JSON = "null", "bool", "int64", "float64", "string", "json"
_SCALAR_KINDS: dict[type, str] = {str: STRING, int: INT, float: FLOAT, bool: BOOL, type(None): NULL}


@dataclass
class Struct:
    fields: dict[str, Kind] = field(default_factory=dict)


@dataclass
class ListOf:
    item: Kind = NULL


Kind = Union[str, Struct, ListOf]


def widen(kind: Kind, value: Any) -> Kind:
    """The kind that covers both `kind` and `value` (structs and lists are widened in place)."""
    if kind is JSON:
        return JSON
    scalar = _SCALAR_KINDS.get(type(value))
    if scalar is not None:
        return _union_scalar(kind, scalar)
    if type(value) is dict:
        if kind is NULL:
            kind = Struct()
        elif not isinstance(kind, Struct):
            return JSON
        fields = kind.fields
        for key, item in value.items():
            known = fields.get(key)
            # The common case, a scalar of the kind already known, costs two lookups.
            if known is None or known is not _SCALAR_KINDS.get(type(item)):
                fields[key] = widen(NULL if known is None else known, item)
        return kind
    if type(value) is list:
        if kind is NULL:
            kind = ListOf()
        elif not isinstance(kind, ListOf):
            return JSON
        types = set(map(type, value))
        if types.issubset(_SCALAR_KINDS):  # token ids, masks: one pass in C
            for scalar_type in types:
                kind.item = _union_scalar(kind.item, _SCALAR_KINDS[scalar_type])
        else:
            for item in value:
                kind.item = widen(kind.item, item)
        return kind
    return JSON


def union(a: Kind, b: Kind) -> Kind:
    """The kind that covers both (a new one: neither argument is changed)."""
    if a is JSON or b is JSON:
        return JSON
    if isinstance(a, str) and isinstance(b, str):
        return _union_scalar(a, b)
    if a is NULL or b is NULL:
        return copy.deepcopy(b if a is NULL else a)
    if isinstance(a, Struct) and isinstance(b, Struct):
        names = list(a.fields) + [name for name in b.fields if name not in a.fields]
        return Struct({name: union(a.fields.get(name, NULL), b.fields.get(name, NULL)) for name in names})
    if isinstance(a, ListOf) and isinstance(b, ListOf):
        return ListOf(union(a.item, b.item))
    return JSON


def _union_scalar(kind: Kind, scalar: str) -> Kind:
    if kind is scalar or scalar is NULL:
        return kind
    if kind is NULL:
        return scalar
    if (kind is INT and scalar is FLOAT) or (kind is FLOAT and scalar is INT):
        return FLOAT
    return JSON


def features_yaml(line: Struct) -> list[dict[str, Any]]:
    """A line's features as the card's YAML list, in `datasets`' own spelling (datasets 5.2.0
    `Features._to_yaml_list`: `dtype: string`; `struct: [...]`; `list: int64`, `list: [...]` for a
    list of structs, `list: {list: ...}` for a list of lists)."""
    return [{"name": name, **_yaml(kind)} for name, kind in line.fields.items()]


def _yaml(kind: Kind) -> dict[str, Any]:
    if isinstance(kind, str):
        return {"dtype": kind}
    if isinstance(kind, Struct):
        if not kind.fields:  # only ever `{}`: a struct of no fields is no Arrow type datasets reads
            return {"dtype": JSON}
        return {"struct": features_yaml(kind)}
    inner = _yaml(kind.item)
    if list(inner) == ["dtype"]:
        return {"list": inner["dtype"]}
    if list(inner) == ["struct"]:
        return {"list": inner["struct"]}
    return {"list": inner}


def uses_json(kind: Kind) -> bool:
    """Whether a mixed field fell back to `json` (the card says which datasets version reads it)."""
    if isinstance(kind, Struct):
        return not kind.fields or any(uses_json(item) for item in kind.fields.values())
    if isinstance(kind, ListOf):
        return uses_json(kind.item)
    return kind is JSON


class LineFeatures:
    """Per dataset, the kind of every line written for it; `merged()` covers them all."""

    def __init__(self) -> None:
        self.datasets: dict[str, Struct] = {}

    def add(self, dataset: str, line: dict[str, Any]) -> None:
        kind = widen(self.datasets.get(dataset, NULL), line)
        assert isinstance(kind, Struct)  # a line is always an object
        self.datasets[dataset] = kind

    def every(self) -> Struct:
        """The kind covering every dataset's lines (the merged output's)."""
        return self.of(list(self.datasets))

    def of(self, datasets: list[str]) -> Struct:
        """The kind covering the lines of these datasets."""
        merged: Kind = NULL
        for name in datasets:
            merged = union(merged, self.datasets.get(name, NULL))
        return merged if isinstance(merged, Struct) else Struct()
