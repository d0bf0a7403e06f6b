"""Requests the real server must refuse for their length: refused at enqueue where the producer can
know it (it knows the context: the tokenizer's `model_max_length`, or `--context-length`), dead-
lettered as `permanent` at the first attempt, with SGLang's own message, where only the server
knows (a server started with a smaller `--context-length` than the tokenizer says).

How SGLang 0.5.23 refuses them, on a streamed `/generate` (HTTP 200 either way):
- `TokenizerManager._validate_one_request` (`managers/tokenizer_manager.py`): an input of at least
  the context ("The input (N tokens) is longer than the model's context length (C tokens).") or
  input + max_new_tokens above it ("Requested token count exceeds the model's maximum context
  length of C tokens. ..."): a ValueError, sent as one `data: {"error": {"message", "type",
  "code": 400, "retryable": false}}` event and `[DONE]` (`entrypoints/http_server.py`
  `stream_results`);
- the scheduler's own bound, stricter by a few tokens: `max_req_input_len = max_req_len - 5` with
  `max_req_len = context - 1` (`managers/tp_worker.py`), checked by `managers/utils.py::
  validate_input_length` ("Input length (N tokens) exceeds the maximum allowed length (M tokens).
  ..."): one final chunk with `finish_reason {"type": "abort", "status_code": 400}`;
- a request it takes, it may still cut short: `Scheduler.init_req_max_new_tokens` lowers
  max_new_tokens to `max_req_len - input - 1` (`managers/scheduler.py`), two tokens below what
  the context leaves.
"""
from __future__ import annotations

import pytest
from helpers.data import write_jsonl
from server import RealServer
from tier import Expectations, enqueue, start_pools

from genfleet.common.run_state import RunState

SMALL_CONTEXT = 2048
TIER_CONTEXT = 32768  # the tier tokenizer's model_max_length (model_dir.py)
# Retries quick enough that a refusal misread as transient shows up as attempts > 1 within the test.
QUICK_RETRIES = {"max_attempts": 3, "retry_backoff_s": 0.1, "retry_backoff_max_s": 0.2}


@pytest.fixture(scope="module")
def small_context(venv, model):
    """A server whose context is smaller than the tokenizer says: only the server knows it."""
    server = RealServer(venv, model, "--context-length", str(SMALL_CONTEXT), "--reasoning-parser", "kimi_k2",
                        name="context2048")
    try:
        yield server.start()
    finally:
        server.stop()


def prompt_of(expect: Expectations, tokens: int, stem: str) -> str:
    """A prompt whose templated ids number exactly `tokens` (each " the" is one token)."""
    text = f"{stem} [plan len=5]"
    pad = tokens - len(expect.prompt_ids({"messages": [{"role": "user", "content": text}]}))
    assert pad >= 0
    text += " the" * pad
    assert len(expect.prompt_ids({"messages": [{"role": "user", "content": text}]})) == tokens
    return text


def test_lengths_the_producer_can_know_are_refused_at_enqueue_and_clip_lowers_what_fits(
        cumulative, real_fleet, model, plan_vocab, tmp_path):
    """The context is the tokenizer's `model_max_length`; max_new_tokens 40,000 is over it."""
    expect = Expectations(model, plan_vocab)
    short = "short [plan len=5]"
    short_tokens = len(expect.prompt_ids({"messages": [{"role": "user", "content": short}]}))
    over = prompt_of(expect, TIER_CONTEXT + 10, "over")  # longer than the context
    data = write_jsonl(tmp_path / "r.jsonl", [{"prompt": p} for p in (short, over)])
    real_fleet.start_worker("long", cumulative.url, wait=False)  # prompt + 40,000 is past the long threshold

    # reserve (the default): no prompt fits with 40,000 new tokens. Nothing is published, and the
    # producer exits 1 naming the fix: a run left with nothing to do is not a success.
    reserve = real_fleet.genfleet("enqueue", "--run", "reserve", "--tokenizer", str(model), "--max-new-tokens", "40000",
                                  f"r={data}", check=False)
    assert reserve.returncode == 1 and "--context-rule clip" in reserve.stderr, reserve.stderr
    assert (f"prompt too long: {short_tokens} prompt tokens + 40000 max new tokens > context length "
            f"{TIER_CONTEXT}") in reserve.stderr
    assert f"prompt too long: {TIER_CONTEXT + 10} prompt tokens + 40000 max new tokens" in reserve.stderr
    totals = real_fleet.progress("reserve").totals()
    assert (totals.total, totals.rejected) == (0, 2)

    # clip: only the prompt that fills the context is refused; the other's max_new_tokens is lowered
    # to what the context leaves, and the server takes it (input + max_new_tokens == context is
    # inside `_validate_one_request`'s `>`).
    clip = enqueue(real_fleet, model, "clip", f"r={data}",
                   extra=("--keep-token-ids", "--context-rule", "clip", "--max-new-tokens", "40000"))
    assert f"prompt too long: {TIER_CONTEXT + 10} prompt tokens >= context length {TIER_CONTEXT}" in clip.stderr
    progress = real_fleet.wait_finished("clip", timeout=60)
    assert (progress.totals().done, progress.totals().failed, progress.totals().rejected) == (1, 0, 1)
    [record] = real_fleet.records("clip")
    assert record["output_ids"] == expect.output_ids(record, TIER_CONTEXT - short_tokens)
    assert record["finish_reason"] == "stop" and record["partition"] == "long"


def test_a_length_only_the_server_knows_is_a_permanent_dead_letter_with_sglangs_message_tried_once(
        small_context, real_fleet, model, plan_vocab, tmp_path):
    real_fleet.configure(**QUICK_RETRIES)
    expect = Expectations(model, plan_vocab)
    rows = {"ok": "fine [plan len=5]", "input": prompt_of(expect, 3000, "input"),
            "total": prompt_of(expect, 1500, "total")}
    data = write_jsonl(tmp_path / "s.jsonl", [{"id": key, "prompt": p} for key, p in rows.items()])
    worker = real_fleet.start_worker("short", small_context.url, wait=False)
    # The producer believes the tokenizer's 32,768: every prompt fits there with 1,000 new tokens.
    enqueue(real_fleet, model, "small", f"s={data}", extra=("--max-new-tokens-short", "1000"))
    progress = real_fleet.wait_finished("small", timeout=60)
    totals = progress.totals()
    assert (totals.done, totals.failed, totals.rejected) == (1, 2, 0)
    assert [r["id"] for r in real_fleet.records("small")] == ["s/ok"]

    letters = RunState(real_fleet.redis, "small").dead_letters()
    assert sorted(letters) == ["s/input", "s/total"]
    expected = {
        "s/input": f"The input (3000 tokens) is longer than the model's context length ({SMALL_CONTEXT} tokens).",
        "s/total": (f"Requested token count exceeds the model's maximum context length of {SMALL_CONTEXT} tokens. "
                    "You requested a total of 2500 tokens: 1500 tokens from the input messages and 1000 tokens "
                    "for the completion."),
    }
    for prompt_id, message in expected.items():
        letter = letters[prompt_id]
        assert (letter["error_class"], letter["attempts"], letter["upstream"]) == ("permanent", 1, small_context.url)
        assert message in letter["message"], letter["message"]
    real_fleet.env["COLUMNS"] = "400"  # one line a group in the table (numbers read N)
    failures = real_fleet.genfleet("failures", "--run", "small").stdout
    assert "The input (N tokens) is longer than the model's context length (N tokens)." in failures
    assert "Requested token count exceeds the model's maximum context length of N tokens." in failures
    assert failures.count("permanent") == 2
    # Nothing left to retry: no message queued or held, and each refused prompt was tried once.
    assert progress.queued.get("short", 0) == 0 and progress.unacked == 0
    assert worker.tail(400).count("Retry in") == 0


def test_a_prompt_past_the_schedulers_own_bound_is_a_permanent_dead_letter_from_its_abort_chunk(
        small_context, real_fleet, model, plan_vocab, tmp_path):
    """Inside the context by the tokenizer manager's rule (input < context, input + max_new_tokens
    == context), past the scheduler's (input >= context - 6): refused by its abort chunk."""
    real_fleet.configure(**QUICK_RETRIES)
    expect = Expectations(model, plan_vocab)
    tokens = SMALL_CONTEXT - 3
    data = write_jsonl(tmp_path / "e.jsonl", [{"id": "edge", "prompt": prompt_of(expect, tokens, "edge")}])
    real_fleet.start_worker("short", small_context.url, wait=False)
    enqueue(real_fleet, model, "edge", f"e={data}", extra=("--max-new-tokens", "3"))
    progress = real_fleet.wait_finished("edge", timeout=60)
    assert (progress.totals().done, progress.totals().failed) == (0, 1)
    letter = RunState(real_fleet.redis, "edge").dead_letters()["e/edge"]
    assert (letter["error_class"], letter["attempts"]) == ("permanent", 1)
    bound = SMALL_CONTEXT - 1 - 5
    assert f"Input length ({tokens} tokens) exceeds the maximum allowed length ({bound} tokens)" in letter["message"]


@pytest.mark.parametrize("rule", ["clip", "reserve"])
def test_a_completion_the_server_cut_at_its_context_is_written_as_cut_not_continued_into_a_refusal(
        rule, small_context, real_fleet, model, plan_vocab, tmp_path):
    """The producer knows the context here (`--context-length 2048`) and fills it: `clip` lowers
    max_new_tokens to what the context leaves, `reserve` takes a cap that exactly fits. The server
    stops two tokens short of that (`init_req_max_new_tokens`), as `length`; a continuation of the
    two would be a prompt past the scheduler's bound, refused. What was generated is the record."""
    real_fleet.configure(**QUICK_RETRIES)
    expect = Expectations(model, plan_vocab)
    prompt = "to the end [plan forever think=5]"
    prompt_tokens = len(expect.prompt_ids({"messages": [{"role": "user", "content": prompt}]}))
    cap = 4000 if rule == "clip" else SMALL_CONTEXT - prompt_tokens
    data = write_jsonl(tmp_path / "t.jsonl", [{"id": "end", "prompt": prompt}])
    real_fleet.configure(stream_interval=64)
    start_pools(real_fleet, small_context.url, "short", "long")
    enqueue(real_fleet, model, "end", f"t={data}",
            extra=("--keep-token-ids", "--context-length", str(SMALL_CONTEXT), "--context-rule", rule,
                   "--max-new-tokens", str(cap), "--on-truncated", "continue"))
    progress = real_fleet.wait_finished("end", timeout=120)
    letters = RunState(real_fleet.redis, "end").dead_letters()
    assert not letters, letters
    assert (progress.totals().done, progress.totals().failed) == (1, 0)
    [record] = real_fleet.records("end")
    generated = SMALL_CONTEXT - prompt_tokens - 2
    assert record["finish_reason"] == "length" and record.get("continued") is None
    assert record["output_ids"] == expect.output_ids(record, generated)
