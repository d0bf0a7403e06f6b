"""The features the dataset card declares (`genfleet/export/features.py`): inferred from every line,
they agree with what pyarrow makes of the same lines, are written in datasets' own YAML spelling, and
fall back to `json` where a field mixes types, which datasets then reads."""
from __future__ import annotations

import pytest

from genfleet.export.features import FLOAT, INT, JSON, STRING, LineFeatures, Struct, features_yaml, uses_json

datasets = pytest.importorskip("datasets", reason="the `hf` extra (pip install -e '.[hf]')")
pa = pytest.importorskip("pyarrow")

# Keys that come and go, nulls before values, lists of structs, lists of lists, token ids.
LINES = [
    {"id": "a/0", "conversations": [{"role": "user", "content": "q"}], "score": None, "ids": [1, 2]},
    {"id": "a/1", "conversations": [{"role": "system", "content": "s", "name": "ops"},
                                    {"role": "assistant", "content": "x", "reasoning_content": "r"}],
     "score": 0.5, "ids": [], "samples": [[{"role": "assistant", "content": "y"}]], "flag": True},
    {"id": "a/2", "conversations": [], "score": 1, "ids": [3], "samples": [], "extra": {"k": [1.5]}},
]


def inferred(lines: list[dict]) -> Struct:
    features = LineFeatures()
    for line in lines:
        features.add("d", line)
    return features.datasets["d"]


def test_inferred_features_are_what_pyarrow_makes_of_the_same_lines():
    declared = datasets.Features._from_yaml_list(features_yaml(inferred(LINES)))
    assert declared == datasets.Features.from_arrow_schema(pa.Table.from_struct_array(pa.array(LINES)).schema)
    assert not uses_json(inferred(LINES))


def test_ints_and_floats_widen_to_float_and_other_mixes_fall_back_to_json():
    kind = inferred([{"n": 1, "mixed": "text", "nested": {"v": [1]}}, {"n": 2.5, "mixed": 3, "nested": {"v": "x"}}])
    assert kind.fields["n"] == FLOAT and kind.fields["mixed"] == JSON
    assert kind.fields["nested"].fields["v"] == JSON and uses_json(kind)
    assert inferred([{"ids": [1, 2, 3]}]).fields["ids"].item == INT
    assert inferred([{"s": None}, {"s": "t"}]).fields["s"] == STRING


def test_the_merged_features_cover_every_dataset_without_changing_theirs():
    features = LineFeatures()
    features.add("a", {"id": "a/0", "only_a": 1})
    features.add("b", {"id": "b/0", "only_b": [{"x": 1}]})
    merged = features.every()
    assert list(merged.fields) == ["id", "only_a", "only_b"]
    assert list(features.datasets["a"].fields) == ["id", "only_a"]


def test_datasets_reads_lines_of_mixed_types_under_the_json_feature():
    lines = [{"id": "0", "meta": {"w": 1}}, {"id": "1", "meta": "high"}, {"id": "2", "meta": [1, "x"]}]
    features = datasets.Features._from_yaml_list(features_yaml(inferred(lines)))
    assert datasets.Dataset.from_list(lines, features=features).to_list() == lines
