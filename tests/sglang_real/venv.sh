#!/usr/bin/env bash
# Builds (once) the real-server tier's SGLang 0.5.23 venv and prints its path. It lives outside the
# clone, under ${GENFLEET_CACHE:-~/.cache/genfleet}/sglang-<hash of requirements.lock>, so a fresh
# clone (CI's) reuses it; a changed lock file builds a new one. Cold: ~2.5 GB, a few minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
key="$(cat "$here/requirements.lock" <("$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)"
venv="${GENFLEET_CACHE:-$HOME/.cache/genfleet}/sglang-$key"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
echo "building the SGLang venv at $venv (once; a few minutes)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip >&2
# The CPU build on this machine's disk; a CUDA build would be several GB more and unusable here.
"$venv/bin/pip" install --quiet torch==2.13.0 >&2
"$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.endswith("+cpu") else f"torch {torch.__version__} is not a CPU build: point pip at a CPU wheel")' >&2
"$venv/bin/pip" install --quiet --no-deps -r "$here/requirements.lock" 2>&1 | grep -v "is neither a file nor a directory" >&2 || true
"$venv/bin/python" -c 'import sglang, transformers; assert sglang.__version__ == "0.5.23", sglang.__version__' >&2
touch "$venv/.complete"
echo "$venv"
