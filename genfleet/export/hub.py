"""`genfleet export --push-to-hub REPO`: the export folder, card and manifest included, uploaded as a
Hugging Face dataset repository; `--dry-run` lists what would go (paths and sizes) and sends nothing.

The upload is huggingface_hub's own (huggingface_hub 2.4.0 `hf_api.py`): `create_repo(exist_ok=True)`
first, since `upload_folder` assumes the repository exists, then `upload_folder`, which keeps the
folder's layout (the card's `data_files` paths stay valid) and ignores nothing of ours (its default
ignore patterns are `.git/` and `.cache/huggingface/`). The token is the hub's own choice: `HF_TOKEN`,
else the one `hf auth login` saved (`utils/_auth.py` `get_token`); genfleet never reads or stores it.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class PlannedFile(NamedTuple):
    path: str  # relative to the export directory, as it will be in the repository
    bytes: int


class PushError(Exception):
    """The upload failed; the message says why (no token, no permission, no network, ...)."""


def check_repo_id(repo: str) -> None:
    """Raises ValueError naming the flag for a repository id the hub would refuse."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ValueError(f"--push-to-hub {repo!r} is not a repository id (owner/name): {error}") from None


def upload_plan(out: Path) -> list[PlannedFile]:
    """Every file under the export directory, as `upload_folder` would send it."""
    return [PlannedFile(path.relative_to(out).as_posix(), path.stat().st_size)
            for path in sorted(out.rglob("*")) if path.is_file()]


def push(out: Path, repo: str, *, private: bool, run: str) -> str:
    """Uploads the export directory to the dataset repository `repo` (created if new); returns the
    commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo, repo_type="dataset", folder_path=out,
                                   commit_message=f"genfleet export of run {run}")
    except (TypeError, AttributeError, NameError):  # a bug here, not a refusal by the Hub: show it whole
        raise
    except Exception as error:  # noqa: BLE001 - HTTP (huggingface_hub 2.4.0 raises httpx2's), auth, network, disk
        raise PushError(f"{type(error).__name__}: {error}") from None
    return str(commit.commit_url)
