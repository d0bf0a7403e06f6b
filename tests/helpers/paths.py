"""Where things are in the repository."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
# The simulator's model directory: the tokenizer and chat template every test renders prompts with.
TOKENIZER = REPO / "sim" / "model"
EXAMPLES = REPO / "examples"
DEPLOY = REPO / "deploy"
# Screenshots and other files a test leaves for a person to look at (git-ignored, `make clean`).
ARTIFACTS = TESTS / "artifacts"
