"""Columnar sources: Parquet files (extra `[parquet]`) and Hugging Face datasets written with
`save_to_disk` (extra `[hf]`). Rows come out as plain dicts; `line` is the 1-based record number."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from genfleet.producer.readers.rows import DatasetReadError, SourceRow

BATCH_ROWS = 2048
HF_MARKERS = ("state.json", "dataset_info.json")


# --- Parquet ---------------------------------------------------------------------------------
def handles_parquet(path: Path) -> bool:
    return path.is_file() and path.suffix == ".parquet"


def count_parquet_rows(path: Path) -> int | None:
    return _parquet_file(path).metadata.num_rows


def read_parquet_rows(path: Path, first_row: int) -> Iterator[SourceRow]:
    name, row = str(path), first_row
    try:
        for batch in _parquet_file(path).iter_batches(batch_size=BATCH_ROWS):
            for data in batch.to_pylist():
                yield SourceRow(row, name, row - first_row + 1, data)
                row += 1
    except OSError as error:  # pyarrow's ArrowInvalid / ArrowIOError are OSError subclasses or ValueErrors
        raise DatasetReadError(f"{name}: unreadable after record {row - first_row}: {error}") from error
    except ValueError as error:
        raise DatasetReadError(f"{name}: unreadable after record {row - first_row}: {error}") from error


def _parquet_file(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetReadError(f"{path}: reading Parquet needs pyarrow: pip install 'genfleet[parquet]'") from None
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as error:
        raise DatasetReadError(f"{path}: not a readable Parquet file: {error}") from error


# --- Hugging Face `save_to_disk` ---------------------------------------------------------------
def handles_hf(path: Path) -> bool:
    return path.is_dir() and (any((path / marker).is_file() for marker in HF_MARKERS)
                              or (path / "dataset_dict.json").is_file())


def count_hf_rows(path: Path) -> int | None:
    return _load_hf(path).num_rows


def read_hf_rows(path: Path, first_row: int) -> Iterator[SourceRow]:
    dataset, name, row = _load_hf(path), str(path), first_row
    # `iter` honours an indices mapping (a selected/shuffled dataset) where the raw arrow table would not.
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        columns = list(batch)
        for values in zip(*(batch[column] for column in columns), strict=True):
            yield SourceRow(row, name, row - first_row + 1, dict(zip(columns, values, strict=True)))
            row += 1


def _load_hf(path: Path) -> Any:
    try:
        from datasets import Dataset, load_from_disk
    except ImportError:
        raise DatasetReadError(f"{path}: reading a saved Hugging Face dataset needs `datasets`: "
                               "pip install 'genfleet[hf]'") from None
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise DatasetReadError(f"{path} is a DatasetDict with splits {splits}: point at one split, "
                               f"e.g. {path / (splits[0] if splits else 'train')}")
    try:
        dataset = load_from_disk(str(path), keep_in_memory=False)
    except (OSError, ValueError) as error:
        raise DatasetReadError(f"{path}: not a readable saved dataset: {error}") from error
    if not isinstance(dataset, Dataset):  # pragma: no cover - DatasetDict caught above
        raise DatasetReadError(f"{path}: expected one Dataset, got {type(dataset).__name__}")
    return dataset.with_format(None)
