"""The baseline genfleet is measured against: the one-file script the seeds use, written as a user
would write it. One process, asyncio + httpx, a semaphore of 150, SGLang's default `/generate`
stream (cumulative, `stream_interval` 1); each SSE line's JSON is parsed and the last text kept,
reasoning is split at `</think>`, and the results are written as JSONL at the end. With
`--api completions`, the same script as a vLLM user writes it: the OpenAI `/v1/completions` stream
(a delta per token, the server's default `--stream-interval` 1), the texts appended, the usage from
the last chunk (`stream_options.include_usage`, vLLM 0.32.0 `entrypoints/openai/completion/protocol.py`).

    python bench/baseline_client.py --url http://127.0.0.1:30000 --tokenizer DIR \
        --prompts prompts.jsonl --out results.jsonl [--concurrency 150] [--max-new-tokens N] \
        [--api generate|completions [--temperature T]]

It is given what a careful user would give it, so the comparison is about the architecture, not
a misconfiguration: a connection pool as large as the semaphore (httpx's default of 100 would
starve 150 streams), no read timeout, `skip_special_tokens: false` so `</think>` survives, and the
prompt templated with the model's chat template into `input_ids`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

THINK_END = "</think>"


async def stream(client: httpx.AsyncClient, url: str, payload: dict) -> AsyncIterator[dict]:
    """Each `data:` line's JSON, up to `[DONE]`."""
    async with client.stream("POST", url, json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            yield json.loads(data)


async def generate(client: httpx.AsyncClient, semaphore: asyncio.Semaphore, url: str, row: dict,
                   input_ids: list[int], max_new_tokens: int) -> dict:
    """SGLang's `/generate`."""
    payload = {
        "input_ids": input_ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_new_tokens, "skip_special_tokens": False},
    }
    async with semaphore:
        started = time.time()
        text, meta = "", {}
        async for chunk in stream(client, f"{url}/generate", payload):
            text = chunk["text"]  # cumulative: each chunk carries the whole text so far
            meta = chunk.get("meta_info", meta)
    return record(row, text, (meta.get("finish_reason") or {}).get("type"), meta.get("completion_tokens", 0),
                  meta.get("prompt_tokens", 0), started)


async def complete(client: httpx.AsyncClient, semaphore: asyncio.Semaphore, url: str, row: dict,
                   input_ids: list[int], max_new_tokens: int, model: str, temperature: float | None) -> dict:
    """The OpenAI `/v1/completions` of vLLM's server."""
    payload = {
        "model": model, "prompt": input_ids, "max_tokens": max_new_tokens, "skip_special_tokens": False,
        "stream": True, "stream_options": {"include_usage": True},
        **({"temperature": temperature} if temperature is not None else {}),
    }
    async with semaphore:
        started = time.time()
        pieces, finish, usage = [], None, {}
        async for chunk in stream(client, f"{url}/v1/completions", payload):
            for choice in chunk.get("choices") or []:
                pieces.append(choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    return record(row, "".join(pieces), finish, usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0),
                  started)


def record(row: dict, text: str, finish_reason: str | None, completion_tokens: int, prompt_tokens: int,
           started: float) -> dict:
    # The chat template opens <think> in the prompt, so the output holds only </think>.
    if THINK_END in text:
        reasoning, content = text.split(THINK_END, 1)
    else:
        reasoning, content = text, ""
    return {
        "id": row["id"],
        "messages": row["messages"],
        "reasoning": reasoning,
        "content": content,
        "finish_reason": finish_reason,
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "started_at": started,
        "duration_s": time.time() - started,
    }


def template(tokenizer, messages: list[dict]) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)  # transformers 5: a dict


async def main_async(args: argparse.Namespace) -> None:
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    with open(args.prompts) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    prompts = [template(tokenizer, row["messages"]) for row in rows]
    semaphore = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0, read=None)) as client:
        if args.api == "completions":
            model = (await client.get(f"{args.url}/v1/models")).json()["data"][0]["id"]
            results = await asyncio.gather(*(
                complete(client, semaphore, args.url, row, ids, args.max_new_tokens, model, args.temperature)
                for row, ids in zip(rows, prompts, strict=True)
            ))
        else:
            results = await asyncio.gather(*(
                generate(client, semaphore, args.url, row, ids, args.max_new_tokens)
                for row, ids in zip(rows, prompts, strict=True)
            ))
    with open(args.out, "w") as handle:
        for result in results:
            handle.write(json.dumps(result) + "\n")
    tokens = sum(result["completion_tokens"] for result in results)
    print(json.dumps({"prompts": len(results), "completion_tokens": tokens}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=150)
    parser.add_argument("--max-new-tokens", type=int, default=10240)
    parser.add_argument("--temperature", type=float, help="with --api completions (default: the server's)")
    parser.add_argument("--api", choices=("generate", "completions"), default="generate",
                        help="SGLang's /generate, or the OpenAI /v1/completions (vLLM)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
