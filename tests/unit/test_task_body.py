"""The real task body (`workers/tasks.py` `complete`) in process, against a simulated server over
real HTTP, a real Redis and real shard files, with no Celery worker (`helpers/task_harness.py`): a
prompt becomes one fsynced record equal to what the server generated, marked done once; a prompt
already done is not generated again; a failure on the wire reaches the failure policy as a typed
error, and nothing is written."""
from __future__ import annotations

import pytest
from helpers.fleet import shard_records
from helpers.task_harness import prompt_payload, run_task, sim_on_a_socket, worker_runtime

from genfleet.common.run_state import RunState
from genfleet.workers.errors import GenerationError, IntegrityError

FAST = ("--rate", "2000", "--length-median", "30", "--length-mean", "35", "--knee", "100000")


def test_a_prompt_becomes_one_record_equal_to_what_the_server_generated(redis_url, redis_client, tmp_path, tokenizer):
    with sim_on_a_socket(*FAST) as sim, worker_runtime(redis_url, tmp_path, sim.url) as runtime:
        payload = prompt_payload(tokenizer, "r", "d", 3, "what is a radix tree?", keep_token_ids=True)
        result, published = run_task(payload, runtime)
        runtime.shards.close()  # sealed, as on the worker's shutdown
        planned = sim.server.settings.plan(payload.input_ids, vocab=sim.server.vocab,
                                           max_new_tokens=payload.max_new_tokens)
    (record,) = shard_records(tmp_path, "r")
    assert published == [] and result["id"] == "d/3"
    assert record["output_ids"] == planned.output_ids and record["finish_reason"] == "stop"
    assert record["usage"]["completion_tokens"] == len(planned.output_ids)
    assert record["reasoning"] + record["content"] and record["upstream"] == sim.url
    assert RunState(redis_client, "r").is_done("d", 3)


def test_a_prompt_already_done_is_not_generated_again(redis_url, tmp_path, tokenizer):
    with sim_on_a_socket(*FAST) as sim, worker_runtime(redis_url, tmp_path, sim.url) as runtime:
        payload = prompt_payload(tokenizer, "r", "d", 4, "and a trie?")
        run_task(payload, runtime)
        started = sim.server.capacity.stats().requests_started
        result, _ = run_task(payload, runtime)
        again = sim.server.capacity.stats().requests_started
    assert result == {"id": "d/4", "skipped": "already done"} and again == started == 1


def test_a_failure_on_the_wire_is_a_typed_error_and_writes_nothing(redis_url, redis_client, tmp_path, tokenizer):
    with sim_on_a_socket(*FAST, "--http-500-rate", "1") as sim, \
            worker_runtime(redis_url, tmp_path, sim.url) as runtime:
        payload = prompt_payload(tokenizer, "r", "d", 5, "a question the server refuses")
        with pytest.raises(GenerationError) as failed:
            run_task(payload, runtime)
    assert failed.value.retryable and failed.value.upstream == sim.url
    assert shard_records(tmp_path, "r") == [] and not RunState(redis_client, "r").is_done("d", 5)


def test_a_text_the_ids_do_not_decode_to_is_an_integrity_failure_of_its_host(redis_url, tmp_path, tokenizer):
    # Found by the decoding after the stream ended, not in the stream: the error must still name
    # the host (the warning said "on None", and the retry could not avoid the host).
    def mismatch(_generation):
        raise IntegrityError("stream integrity: the output ids do not decode to the streamed text")

    with sim_on_a_socket(*FAST) as sim, worker_runtime(redis_url, tmp_path, sim.url) as runtime:
        runtime.splitter.checked_text = mismatch  # type: ignore[method-assign]
        payload = prompt_payload(tokenizer, "r", "d", 6, "a question whose text will not match")
        with pytest.raises(IntegrityError) as failed:
            run_task(payload, runtime)
    assert failed.value.upstream == sim.url and shard_records(tmp_path, "r") == []


def test_the_records_model_is_asked_with_no_slot_held(redis_url, tmp_path, tokenizer):
    # A host slow to answer /model_info must not hold a slot of its own for it: the model is asked
    # once the stream's slot is given back (and only for a record, not for each part or turn).
    with sim_on_a_socket(*FAST) as sim, worker_runtime(redis_url, tmp_path, sim.url) as runtime:
        held_when_asked: list[int] = []
        info = runtime.server.sglang.info  # the SGLang kind's cache of /server_info and /model_info
        ask = info.model_identity

        def model_identity(upstream: str):
            held_when_asked.append(runtime.upstreams.in_flight().get(upstream, 0))
            return ask(upstream)

        info.model_identity = model_identity  # type: ignore[method-assign]
        run_task(prompt_payload(tokenizer, "r", "d", 6, "what is a heap?"), runtime)
    assert held_when_asked == [0]
