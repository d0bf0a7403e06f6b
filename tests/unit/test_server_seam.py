"""The server seam (docs/ARCHITECTURE.md, `workers/servers/`): no product module outside it names an
endpoint the workers call or reads a field of a server's answers. Code only: docstrings, comments
and prose inside a message (a path not at the start of a string) may mention them. The simulator
(`sim/`), which serves those endpoints, is the server side and not bound by it."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from helpers.sources import Module, modules

SEAM = ("genfleet", "workers", "servers")
# A string that starts with an endpoint path, or an f-string part that does (f"{url}/health").
ENDPOINT = re.compile(r"^/(generate|server_info|get_server_info|model_info|abort_request|v1/chat/completions|"
                      r"v1/completions|v1/loads|v1/models|health|version)\b")
# Fields of SGLang's answers and requests (`meta_info`, the chat deltas, `/v1/loads`, the info pages).
# Some names are also genfleet's own (`ServerLoad.gen_throughput`, export's `require_reasoning`
# filter, the OpenAI message's `reasoning_content` that export writes): those are not listed.
SERVER_FIELDS = {"meta_info", "num_running_reqs", "num_waiting_reqs", "served_model_name", "model_path",
                 "incremental_streaming_output", "max_total_num_tokens", "num_retractions", "max_model_len",
                 "sampling_params", "stream_options", "completion_tokens_details", "separate_reasoning"}


def strings(module: Module) -> Iterator[tuple[int, str]]:
    """(line, value) of every string constant in code: docstrings left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(module.tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def crossings(module: Module) -> list[str]:
    return [f"{module.path}:{line}: {value!r}" for line, value in strings(module)
            if ENDPOINT.search(value) or value in SERVER_FIELDS]


def outside_the_seam() -> Iterator[Module]:
    """Every product module that could talk to a server: export writes formats of its own (the
    OpenAI batch output names `completion_tokens_details` too), and reads no server."""
    for package in ("common", "producer", "workers", "genfleet"):
        for module in modules(package):
            if module.path.parts[:3] != SEAM and module.path.parts[:2] != ("genfleet", "export"):
                yield module


def test_no_module_outside_the_seam_names_an_endpoint_or_reads_a_server_field():
    found = [line for module in outside_the_seam() for line in crossings(module)]
    assert found == [], "server wire outside workers/servers/:\n" + "\n".join(found)


def test_the_check_sees_a_path_and_a_field_in_code_and_not_in_prose():
    planted = ast.parse('"""About /health and meta_info."""\n'
                        'def probe(url, chunk):\n'
                        '    """GET /health."""\n'
                        '    log("run a server that answers /health")\n'
                        '    return get(f"{url}/health"), chunk["meta_info"]\n')
    module = Module(path=Path("planted.py"), text="", tree=planted, package="workers")
    assert sorted(line.split(": ", 1)[1] for line in crossings(module)) == ["'/health'", "'meta_info'"]


def test_the_sglang_kind_implements_the_whole_interface():
    # mypy checks the signatures (`make lint`); this keeps the two from drifting apart by name.
    from genfleet.workers.servers.api import ServerApi
    from genfleet.workers.servers.sglang import SglangServer

    wanted = {name for name in vars(ServerApi) if not name.startswith("_")} | set(ServerApi.__annotations__)
    assert wanted <= set(dir(SglangServer))
