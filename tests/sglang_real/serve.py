"""`python serve.py --model-path DIR [sglang's server flags]`: SGLang 0.5.23's own HTTP server, run
by its own `launch_server`, with the scheduler process's `ModelRunner.forward` replaced by the plan
(`forward_patch`). Runs inside the tier's SGLang venv (`venv.sh`), with this folder and
`stand_ins/` on PYTHONPATH; the test tier starts it (`server.py`).

`launch_server(server_args, run_scheduler_process_func=...)` is SGLang's own hook for running code
in the scheduler process (0.5.23 `entrypoints/http_server.py`); the function must be importable by
name there, since the scheduler is a spawned process.
"""
from __future__ import annotations

import os
import sys


def run_scheduler_with_plan(server_args, *args, **kwargs):
    import forward_patch
    from sglang.srt.managers.scheduler import run_scheduler_process

    forward_patch.install(server_args.model_path)
    return run_scheduler_process(server_args, *args, **kwargs)


def main(argv: list[str]) -> None:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(argv)
    try:
        launch_server(server_args, run_scheduler_process_func=run_scheduler_with_plan)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
