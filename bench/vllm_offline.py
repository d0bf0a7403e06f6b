"""vLLM 0.32.0's own offline path, on the vLLM tier's bench model: the ceiling the sweep's vLLM half
(bench/sweep_vllm.py) measures the fleet against. No HTTP and no client: every request handed to
the engine at once and the engine stepped until none is left, as vLLM's own benchmark does (0.32.0
`benchmarks/throughput.py` `_run_vllm_requests`: `LLM.from_engine_args`, then `llm.generate` of
every `TokensPrompt`, timed around that call; `generate` steps `llm_engine` until it has no
unfinished request, `entrypoints/common/offline.py` `_run_engine`). Here the loop is that loop,
written out so that it can read the engine's own count of generated tokens as it goes
(`LLM.get_metrics`, `vllm:generation_tokens`; stats on), and the sampling is the fleet's: greedy,
the stop ids honoured (the benchmark's `ignore_eos=True, temperature=1.0` would make other
completions than the fleet's runs got), the prompts the ids genfleet published.

    <vllm venv>/bin/python bench/vllm_offline.py REQUESTS.json OUT.json [vLLM's engine flags]

REQUESTS.json: [{"id", "input_ids", "max_new_tokens"}]. OUT.json: the wall time of the loop, its
completion tokens, (seconds, tokens generated so far) along it, each request's output ids. The
flags are the server's (`--max-num-seqs 512 --num-gpu-blocks-override 64 ...`), parsed by vLLM's
own `EngineArgs` parser.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time

WARM_UP_REQUESTS = 4
READ_EVERY_S = 0.25
GENERATED = "vllm:generation_tokens"


def generated_tokens(llm) -> float:
    """The engine's own count of generated tokens (its Prometheus counter, as the server's /metrics
    shows it)."""
    return sum(getattr(metric, "value", 0) for metric in llm.get_metrics() if metric.name == GENERATED)


def main(argv: list[str]) -> None:
    requests_path, out_path, *flags = argv
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    engine_args = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(flags))
    # LLM's default is off: the counter the decode rate is read from.
    engine_args = dataclasses.replace(engine_args, disable_log_stats=False)
    with open(requests_path) as file:
        requests = json.load(file)
    llm = LLM.from_engine_args(engine_args)
    llm.generate([TokensPrompt(prompt_token_ids=r["input_ids"]) for r in requests[:WARM_UP_REQUESTS]],
                 SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    llm.enqueue([TokensPrompt(prompt_token_ids=r["input_ids"]) for r in requests],
                [SamplingParams(temperature=0, max_tokens=r["max_new_tokens"]) for r in requests], use_tqdm=False)
    started = time.perf_counter()
    base, points, next_read = generated_tokens(llm), [], 0.0
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
        if (now := time.perf_counter() - started) >= next_read:
            points.append((now, generated_tokens(llm) - base))
            next_read = now + READ_EVERY_S
    wall_s = time.perf_counter() - started
    points.append((wall_s, generated_tokens(llm) - base))
    # The outputs' request ids count up in the order the requests went in (`_run_engine` sorts its
    # outputs back by them too; `enqueue` returns the engine's own ids, with a suffix, not these).
    ordered = [finished[key] for key in sorted(finished, key=int)]
    outputs = {r["id"]: ids for r, ids in zip(requests, ordered, strict=True)}
    result = {"wall_s": wall_s, "completion_tokens": sum(len(ids) for ids in outputs.values()), "decoded": points,
              "outputs": outputs}
    with open(out_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(sys.argv[1:])
