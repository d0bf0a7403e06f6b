"""`genfleet sim` speaks SGLang 0.5.23's wire format: the same requests (the tier's templated
prompts, the same sampling params, raw HTTP) go to the real server and to a sim run with the real
server's settings, and the SHAPES of the answers must be equal: the keys of every chunk and of its
meta_info (in order, with their value types), the chunk cadence, cumulative or delta text and ids,
the finish reasons, [DONE], error statuses and bodies, the chat API's chunks, and the fields of the
info endpoints that genfleet reads. The generated tokens differ by design (the plan vs the sim's own
completions) and are not compared.

Where the two differ on purpose, the test pins the difference as documented, so that either side
changing shows up here: docs/sim-conformance.md lists every aspect, what differs and why that is
harmless to genfleet."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.sim_in_process import parse_sim_args
from helpers.sim_process import SimProcess
from server import RealServer

from genfleet.producer.prompts import PromptTemplater
from genfleet.sim.vocab import SimVocab
from genfleet.workers.servers.sglang_info import (
    ServerInfo,
    StreamMode,
    identity_from_model_info,
    load_from_loads,
    revision_from_server_info,
)

MODES = ("cumulative", "incremental")
SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"
# Sim completions stop by themselves after 20 to 400 tokens (which, for each prompt, the sim's
# settings predict), at 400 tok/s; pages of 1 token, as SGLang's radix cache has them by default.
SIM_FLAGS = ("--rate", "400", "--length-tokens", "20:400", "--page-size", "1")
EOS = 2  # <|im_end|>: one id in both vocabularies, the stop token of both
LENGTH_CUT = 17  # under every completion of both servers here: a length finish on both
# The plan's directives shape the real server's completions (tests/sglang_real/plan.py); the sim's
# are picked by their predicted length among numbered questions.
DIRECTIVES = ("[plan len=12 think=8]", "[plan len=30 think=20]", "[plan len=5 think=40]")
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# One client for the module: a new one per request costs ~10x the request on this machine (TLS
# context, pool). Idle connections are dropped after 1 s, well before both servers' keep-alive
# timeout (uvicorn's 5 s; sglang 0.5.23 `SGLANG_TIMEOUT_KEEP_ALIVE`), so no request is sent on a
# connection the server is closing.
HTTP = httpx.Client(timeout=60, limits=httpx.Limits(keepalive_expiry=1.0))


@dataclass(frozen=True)
class Pair:
    """A real server and the sim that mirrors it, with prompts both serve alike."""

    mode: str
    real: str
    sim: str
    prompts: tuple[list[int], ...]  # stop by themselves on both within 64 tokens (sim) / 200 (real)
    messages: tuple[list[dict[str, str]], ...]  # the same prompts as chat messages
    long_prompt: list[int]  # the sim's completion runs >= 300 tokens: a stream to abort mid-flight
    weight_version: str  # the real server's --weight-version, which the sim is given too

    def both(self) -> Iterator[tuple[str, str]]:
        yield "real", self.real
        yield "sim", self.sim


def real_settings(server: RealServer) -> dict[str, Any]:
    info = server.get("/server_info")
    return {"stream_interval": info["stream_interval"], "incremental": info["incremental_streaming_output"],
            "reasoning_parser": info["reasoning_parser"], "weight_version": info["weight_version"],
            "context_length": server.get("/v1/models")["data"][0]["max_model_len"]}


def sim_flags(settings: dict[str, Any]) -> tuple[str, ...]:
    """The sim flags that mirror a real server's settings."""
    return (*SIM_FLAGS, "--stream-interval", str(settings["stream_interval"]),
            "--reasoning-format", settings["reasoning_parser"],
            "--context-length", str(settings["context_length"]), "--weight-version", settings["weight_version"],
            *(("--incremental",) if settings["incremental"] else ()))


def sim_length(planner: Any, vocab: SimVocab, ids: list[int]) -> int:
    """How many tokens the sim with these settings generates for `ids` (its plan is a pure function)."""
    return planner.plan(ids, vocab=vocab, max_new_tokens=1000).completion_tokens


@pytest.fixture(scope="module")
def pairs(servers: dict[str, RealServer], model: Path) -> Iterator[dict[str, Pair]]:
    templater = PromptTemplater(str(model))
    vocab = SimVocab.from_tokenizer_dir()
    started: list[SimProcess] = []
    try:
        made = {}
        for mode in MODES:
            settings = real_settings(servers[mode])
            flags = sim_flags(settings)
            planner = parse_sim_args(flags)
            sim = SimProcess(*flags)
            sim.start()
            started.append(sim)
            questions = [[{"role": "user", "content": f"question {i} {DIRECTIVES[i % 3]}"}] for i in range(200)]
            short = [m for m in questions if sim_length(planner, vocab, templater.render([m])[0]) <= 64][:3]
            endless = ([{"role": "user", "content": f"abort {i} [plan forever]"}] for i in range(200))
            long = next(m for m in endless if sim_length(planner, vocab, templater.render([m])[0]) >= 300)
            made[mode] = Pair(mode, servers[mode].url, sim.url, tuple(templater.render([m])[0] for m in short),
                              tuple(short), templater.render([long])[0], settings["weight_version"])
        yield made
    finally:
        for sim in started:
            sim.stop()
        HTTP.close()


@pytest.fixture(params=MODES)
def pair(request: pytest.FixtureRequest, pairs: dict[str, Pair]) -> Pair:
    """Each stream mode's pair, for what the mode (or the reasoning parser with it) shapes."""
    return pairs[request.param]


@pytest.fixture
def one_pair(pairs: dict[str, Pair]) -> Pair:
    """One pair, for what no stream mode touches: refusals before the stream, one-shot answers, health."""
    return pairs["cumulative"]


# -- reading answers ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    content_type: str | None
    body: bytes

    @property
    def payloads(self) -> list[str]:
        """The `data:` payloads of an SSE body, its framing checked."""
        text = self.body.decode()
        assert text.endswith("\n\n"), text[-200:]
        events = text[:-2].split("\n\n")
        assert all(event.startswith("data: ") for event in events), text[:500]
        return [event[len("data: "):] for event in events]

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON chunks of a stream that ended with [DONE], without it."""
        payloads = self.payloads
        assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
        return [json.loads(payload) for payload in payloads[:-1]]

    def json(self) -> Any:
        return json.loads(self.body)

    def wire(self) -> tuple[int, str | None, Any]:
        """Status, content type and body: everything a client sees of a refusal."""
        return self.status, self.content_type, self.payloads if self.content_type == SSE else self.json()


def post(url: str, path: str, body: dict[str, Any]) -> Answer:
    response = HTTP.post(url + path, json=body)
    return Answer(response.status_code, response.headers.get("content-type"), response.content)


def generate(url: str, ids: list[int], stream: bool = True, **sampling: Any) -> Answer:
    return post(url, "/generate", {"input_ids": ids, "stream": stream, "sampling_params": sampling})


def shape(value: Any, key: str | None = None) -> Any:
    """A JSON value's shape: objects keep their keys (in order), lists the shapes of their items,
    scalars become their type. A prefix-cache breakdown is null or {device, host} by what the cache
    held, on either server: either counts as the same shape."""
    if key == "cached_tokens_details":
        assert value is None or (list(value) == ["device", "host"] and all(type(v) is int for v in value.values()))
        return "null | {device: int, host: int}"
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            if shape(item) not in shapes:
                shapes.append(shape(item))
        return shapes
    return "null" if value is None else type(value).__name__


def keys_in_order(value: Any, prefix: str = "") -> list[str]:
    """Every object key, dotted, in the order the bytes carry them (a dict's equality ignores it)."""
    if isinstance(value, dict):
        return [path for k, v in value.items()
                for path in (prefix + k, *([] if k == "cached_tokens_details" else keys_in_order(v, prefix + k + ".")))]
    if isinstance(value, list) and value:
        return keys_in_order(value[0], prefix + "0.")
    return []


def wire_shape(value: Any) -> tuple[Any, list[str]]:
    return shape(value), keys_in_order(value)


def counts(events: list[dict[str, Any]]) -> list[int]:
    return [event["meta_info"]["completion_tokens"] for event in events]


def cadence(total: int, interval: int) -> list[int]:
    """SGLang 0.5.23's chunks for `total` tokens at `interval` in plain decoding
    (`managers/scheduler_components/output_streamer.py`): the first token alone, then a chunk each
    time `interval` tokens are unsent, and the final chunk with the rest."""
    return [*range(1, total, interval), total]


def stream_kind(events: list[dict[str, Any]]) -> str:
    """"cumulative" (each chunk: everything so far) or "incremental" (each chunk: what is new)."""
    sent = counts(events)
    before = [0, *sent[:-1]]
    texts = [event["text"] for event in events]
    ids = [len(event["output_ids"]) for event in events]
    if ids == sent and all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False)):
        return "cumulative"
    if ids == [n - b for n, b in zip(sent, before, strict=True)]:
        return "incremental"
    return "neither"


def assembled(events: list[dict[str, Any]], kind: str) -> tuple[str, list[int]]:
    if kind == "cumulative":
        return events[-1]["text"], events[-1]["output_ids"]
    return "".join(e["text"] for e in events), [i for e in events for i in e["output_ids"]]


# -- /generate streams -------------------------------------------------------------------------


def is_subsequence(short: list[int], long: list[int]) -> bool:
    rest = iter(long)
    return all(item in rest for item in short)


def real_stream_at_cadence(url: str, body: dict[str, Any], interval: int, attempts: int = 6) -> list[dict[str, Any]]:
    """The real server's stream of `body`, its chunks at the scheduler's cadence. A client of a
    backlogged server gets fewer chunks: SGLang 0.5.23 drains the outputs queued for a request and
    sends one, the last (cumulative) or all of them joined (incremental;
    `managers/tokenizer_manager.py` `_wait_one_response`, `_coalesce_streaming_chunks`). So every
    stream must be a subsequence of the cadence, ending where it ends, and the streams asked (up to
    `attempts`, stopping at the first whole one) must between them send a chunk at every point of
    the cadence: a server that skipped or shifted a point fails either way, a busy machine neither.
    On this shared machine a stream at interval 1 (a chunk per decode step, steps of a millisecond)
    is rarely left whole, so there only the first token's chunk must come alone. Returns the stream
    with the most chunks among those whose first token came alone (its chunk has the first shape)."""
    streams: list[list[dict[str, Any]]] = []
    seen: set[int] = set()
    for _ in range(attempts):
        answer = post(url, "/generate", body)
        assert (answer.status, answer.content_type) == (200, SSE)
        events = answer.events
        sent, total = counts(events), events[-1]["meta_info"]["completion_tokens"]
        expected = cadence(total, interval)
        assert is_subsequence(sent, expected) and sent[-1] == total, (sent, expected)
        if sent == expected or (interval == 1 and sent[0] == 1):
            return events
        streams.append(events)
        seen.update(sent)
        if interval > 1 and seen == set(expected):
            return max(streams, key=lambda events: (counts(events)[0] == 1, len(events)))
    raise AssertionError(f"{attempts} streams sent chunks at {sorted(seen)}, not at every point of {expected}")


def chunk_shapes(events: list[dict[str, Any]]) -> list[Any]:
    """The first chunk's shape, the (one) shape of the chunks between, the final chunk's."""
    between: list[Any] = []
    for chunk in events[1:-1]:
        if wire_shape(chunk) not in between:
            between.append(wire_shape(chunk))
    return [wire_shape(events[0]), between, wire_shape(events[-1])]


@pytest.mark.parametrize("interval", [None, 4, 8])
def test_a_streamed_generate_cut_by_length_sends_the_same_chunks_with_the_same_keys_at_the_same_cadence(
        pair, interval):
    sampling = {"max_new_tokens": LENGTH_CUT, **({"stream_interval": interval} if interval else {})}
    for number, ids in enumerate(pair.prompts):
        body = {"input_ids": ids, "rid": f"cut-{pair.mode}-{interval}-{number}", "stream": True,
                "sampling_params": sampling}
        real = real_stream_at_cadence(pair.real, body, interval or 1)
        answer = post(pair.sim, "/generate", body)
        assert (answer.status, answer.content_type) == (200, SSE)
        sim = answer.events
        assert counts(sim) == cadence(LENGTH_CUT, interval or 1)
        assert is_subsequence(counts(real), counts(sim))  # whole where the machine allowed: see real_stream_at_cadence
        real_first, real_between, real_last = chunk_shapes(real)
        sim_first, sim_between, sim_last = chunk_shapes(sim)
        assert (real_first, real_last) == (sim_first, sim_last)
        # A stream that lost chunks to a busy machine may lack one of the shapes between.
        assert all(one in sim_between for one in real_between)
        assert real_between == sim_between or counts(real) != counts(sim)
        for events in (real, sim):
            assert stream_kind(events) == pair.mode
            assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": LENGTH_CUT}
            assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
            assert {e["meta_info"]["id"] for e in events} == {body["rid"]}
            assert {e["meta_info"]["weight_version"] for e in events} == {pair.weight_version}


@pytest.mark.parametrize("interval", [None, 8])
def test_a_streamed_generate_that_stops_ends_on_the_matched_stop_token_in_the_same_shape(pair, interval):
    sampling = {"max_new_tokens": 200, **({"stream_interval": interval} if interval else {})}
    for ids in pair.prompts:
        body = {"input_ids": ids, "stream": True, "sampling_params": sampling}
        shapes = {}
        for name, url in pair.both():
            if name == "real":
                events = real_stream_at_cadence(url, body, interval or 1)
            else:
                events = post(url, "/generate", body).events
            whole = generate(url, ids, stream=False, **sampling).json()
            if name == "sim":  # the real one is at the cadence where the machine allowed: real_stream_at_cadence
                assert counts(events) == cadence(events[-1]["meta_info"]["completion_tokens"], interval or 1)
            assert events[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
            kind = stream_kind(events)
            assert kind == pair.mode
            # The stop token is the last id sent, but its text is trimmed (`trim_matched_stop`).
            assert assembled(events, kind) == (whole["text"], whole["output_ids"])
            assert whole["output_ids"][-1] == EOS and "<|im_end|>" not in whole["text"]
            shapes[name] = chunk_shapes(events)
        assert shapes["sim"] == shapes["real"]


def test_a_non_streamed_generate_answers_one_object_with_the_same_keys(one_pair):
    for ids in one_pair.prompts:
        for sampling in ({"max_new_tokens": LENGTH_CUT}, {"max_new_tokens": 200}):
            answers = {name: generate(url, ids, stream=False, **sampling) for name, url in one_pair.both()}
            assert {(a.status, a.content_type) for a in answers.values()} == {(200, JSON)}
            real, sim = (answers[name].json() for name in ("real", "sim"))
            assert wire_shape(sim) == wire_shape(real)
            assert sim["meta_info"]["finish_reason"].keys() == real["meta_info"]["finish_reason"].keys()
            assert sim["meta_info"]["weight_versions"] == [{
                "version": one_pair.weight_version, "start": 0, "end": sim["meta_info"]["completion_tokens"]}]
            assert real["meta_info"]["weight_versions"] == [{
                "version": one_pair.weight_version, "start": 0, "end": real["meta_info"]["completion_tokens"]}]


def test_an_aborted_stream_ends_with_the_same_abort_finish_then_done(pair):
    finals = {}
    for name, url in pair.both():
        rid = f"abort-{pair.mode}-{name}"
        body = {"input_ids": pair.long_prompt, "rid": rid, "stream": True, "sampling_params": {"max_new_tokens": 2000}}
        with HTTP.stream("POST", url + "/generate", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            aborted = HTTP.post(url + "/abort_request", json={"rid": rid}, timeout=10)
            rest = [line[len("data: "):] for line in lines if line]
        assert (aborted.status_code, aborted.content) == (200, b"")
        assert rest[-1] == "[DONE]"
        final = json.loads(rest[-2])
        assert final["meta_info"]["finish_reason"] == ABORTED
        assert final["meta_info"]["completion_tokens"] < 2000
        assert all(type(i) is int for i in final["output_ids"]) and isinstance(final["text"], str)
        finals[name] = final
    # The ids (and text) of the last chunk: as many as were decoded since the one before, which in
    # incremental mode may be none in the sim (documented); only their type is compared.
    real, sim = finals["real"], finals["sim"]
    assert list(sim) == list(real) == ["text", "output_ids", "meta_info"]
    assert wire_shape(sim["meta_info"]) == wire_shape(real["meta_info"])


def test_generate_counts_reasoning_tokens_its_own_way_as_documented(one_pair):
    """Documented difference: SGLang counts a /generate request's reasoning only when the request
    says it reasons (`require_reasoning`) or the output opens its own `<think>` (0.5.23
    `managers/scheduler_components/batch_result_processor.py` `_maybe_update_reasoning_tokens`);
    the tier's prompts open it in the template, so SGLang says 0. The sim counts its reasoning
    words. genfleet only adds the number up (usage, a counter)."""
    counted = {name: generate(url, one_pair.prompts[0], stream=False, max_new_tokens=200).json()["meta_info"][
        "reasoning_tokens"] for name, url in one_pair.both()}
    assert counted["real"] == 0 and counted["sim"] > 0


# -- /generate refusals ------------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_is_one_error_event_then_done_at_http_200(one_pair):
    too_long = (one_pair.prompts[0] * (40000 // len(one_pair.prompts[0])))[:32784]
    for stream in (True, False):
        real, sim = (generate(url, too_long, stream=stream, max_new_tokens=4).wire() for _, url in one_pair.both())
        assert sim == real
    streamed = generate(one_pair.sim, too_long, max_new_tokens=4)
    assert streamed.events == [{"error": {
        "message": "The input (32784 tokens) is longer than the model's context length (32768 tokens).",
        "type": "invalid_request_error", "code": 400, "retryable": False}}]
    plain = generate(one_pair.sim, too_long, stream=False, max_new_tokens=4)
    assert (plain.status, list(plain.json()), list(plain.json()["error"])) == (400, ["error"], ["message"])


# Not here: prompt + max_new_tokens over the context, which SGLang refuses and the sim serves (a
# documented difference: docs/sim-conformance.md).
BAD_SAMPLING = [
    {"temperature": -1}, {"top_p": 0}, {"min_p": 2.0}, {"top_k": 0}, {"presence_penalty": -2.5},
    {"repetition_penalty": 0}, {"min_new_tokens": 10, "max_new_tokens": 5}, {"max_new_tokens": -1},
]


@pytest.mark.parametrize("sampling", BAD_SAMPLING, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_an_invalid_sampling_param_is_refused_with_the_same_status_and_body(one_pair, sampling):
    for stream in (True, False):
        real, sim = (generate(url, one_pair.prompts[0], stream=stream, **sampling).wire() for _, url in one_pair.both())
        assert sim == real
        status, content_type, body = sim
        if stream:  # validated inside the stream, after the 200 went out
            assert (status, content_type, body[-1], list(json.loads(body[0])["error"])) == (
                200, SSE, "[DONE]", ["message", "type", "code", "retryable"])
        else:
            assert (status, list(body), list(body["error"])) == (400, ["error"], ["message"])


SCHEMA_REFUSED = [
    {"bogus": 1}, {"temperature": "hot"}, {"max_new_tokens": 1.5}, {"stop": 5}, {"stop_token_ids": [1.5]},
    {"ignore_eos": 1}, {"logit_bias": []}, {"choice": "x"}, {"watermark": {"colour": 1}},
]


@pytest.mark.parametrize("sampling", SCHEMA_REFUSED, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_an_unknown_or_mistyped_sampling_param_is_refused_by_the_schema_gate_alike(one_pair, sampling):
    for stream in (True, False):
        real, sim = (generate(url, one_pair.prompts[0], stream=stream, **sampling).wire() for _, url in one_pair.both())
        assert sim == real
        assert sim[:2] == (400, JSON) and list(sim[2]) == ["error"] and isinstance(sim[2]["error"], str)


@pytest.mark.parametrize("body", [{"input_ids": []}, {}], ids=["empty input_ids", "no prompt"])
def test_a_request_without_prompt_tokens_is_refused_alike(one_pair, body):
    for stream in (True, False):
        request = {**body, "stream": stream, "sampling_params": {"max_new_tokens": 4}}
        real, sim = (post(url, "/generate", request).wire() for _, url in one_pair.both())
        assert sim == real


# -- /v1/chat/completions ----------------------------------------------------------------------


def chat_kind(chunk: dict[str, Any]) -> str:
    if not chunk["choices"]:
        return "usage"
    (choice,) = chunk["choices"]
    if choice["finish_reason"] is not None:
        return "finish"
    delta = choice["delta"]
    return "role" if "role" in delta else "reasoning" if delta.get("reasoning_content") else "content"


def chat_stream_summary(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The stream's runs of chunk kinds (role, reasoning, content, finish, usage), each run with its
    chunks' shape, which must be one shape per run."""
    runs: list[tuple[str, Any]] = []
    for chunk in events:
        kind, chunk_shape = chat_kind(chunk), wire_shape(chunk)
        if runs and runs[-1][0] == kind:
            assert runs[-1][1] == chunk_shape, (kind, chunk)
        else:
            runs.append((kind, chunk_shape))
    return runs


def test_a_streamed_chat_sends_the_same_role_reasoning_content_finish_and_usage_chunks(pair):
    for messages in pair.messages:
        summaries, usages = {}, {}
        for name, url in pair.both():
            rid = f"chat-{pair.mode}-{name}-{messages[0]['content']}"
            answer = post(url, "/v1/chat/completions", {
                "model": "m", "messages": messages, "max_tokens": 200, "rid": rid, "stream": True,
                "stream_options": {"include_usage": True}})
            assert (answer.status, answer.content_type) == (200, SSE)
            events = answer.events
            assert {e["id"] for e in events} == {rid}  # genfleet sends a rid, which names the completion
            summaries[name] = chat_stream_summary(events)
            assert [kind for kind, _ in summaries[name]] == ["role", "reasoning", "content", "finish", "usage"]
            finish = events[-2]["choices"][0]
            assert (finish["delta"], finish["finish_reason"], finish["matched_stop"]) == (
                {"reasoning_content": None}, "stop", EOS)
            usages[name] = events[-1]["usage"]
        assert summaries["sim"] == summaries["real"]
        assert usages["sim"]["prompt_tokens"] == usages["real"]["prompt_tokens"]  # one template, one tokenizer


def test_a_streamed_chat_cut_by_max_tokens_finishes_with_length_alike(pair):
    finishes = {}
    for name, url in pair.both():
        answer = post(url, "/v1/chat/completions", {"model": "m", "messages": pair.messages[0], "max_tokens": 5,
                                                   "stream": True, "stream_options": {"include_usage": True}})
        events = answer.events
        finishes[name] = (events[-2]["choices"][0], wire_shape(events[-2]), wire_shape(events[-1]))
        assert events[-1]["usage"]["completion_tokens"] == 5
    assert finishes["sim"][1:] == finishes["real"][1:]
    assert [(f["finish_reason"], f["matched_stop"]) for f, _, _ in finishes.values()] == [("length", None)] * 2


def test_a_non_streamed_chat_answers_the_same_object_but_for_tool_calls_and_an_empty_content(one_pair):
    """genfleet streams the chat API; the one-shot answer is compared for completeness. Documented
    differences: the sim writes `tool_calls: null` where SGLang drops the key (0.5.23
    `entrypoints/openai/protocol.py` `ChatMessage._serialize`), and a completion cut inside its
    reasoning has content null in the sim, "" in SGLang."""
    for number, messages in enumerate(one_pair.messages):
        answers = {}
        for name, url in one_pair.both():
            answer = post(url, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 200,
                                                       "rid": f"one-shot-{name}-{number}"})
            assert (answer.status, answer.content_type) == (200, JSON)
            answers[name] = answer.json()
        real, sim = answers["real"], answers["sim"]
        assert sim["choices"][0]["message"].pop("tool_calls") is None and "tool_calls" not in real["choices"][0][
            "message"]
        assert wire_shape(sim) == wire_shape(real)
        for answer in (real, sim):
            assert answer["metadata"] == {"weight_version": one_pair.weight_version, "weight_versions": [
                {"version": one_pair.weight_version, "start": 0, "end": answer["usage"]["completion_tokens"]}]}
    cut = [post(url, "/v1/chat/completions", {"model": "m", "messages": one_pair.messages[0], "max_tokens": 3}).json()[
        "choices"][0]["message"] for _, url in one_pair.both()]
    assert [message["content"] for message in cut] == ["", None]


CHAT_REFUSED = [{"temperature": -1}, {"top_p": 0}, {"top_k": 0}, {"max_tokens": -1}, {"max_tokens": 32760},
                {"messages": [{"role": "user", "content": "word " * 33000}], "max_tokens": 3}]


@pytest.mark.parametrize("extra", CHAT_REFUSED, ids=["temperature", "top_p", "top_k", "max_tokens<0",
                                                     "over the context", "prompt too long"])
def test_a_refused_chat_request_gets_the_same_openai_error_object_streamed_or_not(one_pair, extra):
    for stream in (True, False):
        body = {"model": "m", "messages": one_pair.messages[0], **extra, "stream": stream}
        real, sim = (post(url, "/v1/chat/completions", body).wire() for _, url in one_pair.both())
        assert sim == real
        assert (sim[0], sim[1], list(sim[2]), sim[2]["type"]) == (
            400, JSON, ["object", "message", "type", "param", "code"], "BadRequestError")


# -- what the servers say about themselves -----------------------------------------------------


def test_server_info_says_the_same_about_what_workers_and_doctor_read(pair):
    infos = {name: ServerInfo(HTTP).ask_server_info(url) for name, url in pair.both()}
    real, sim = infos["real"], infos["sim"]
    assert StreamMode.from_server_info(sim) == StreamMode.from_server_info(real) == StreamMode(
        pair.mode == "incremental", 1)
    assert revision_from_server_info(sim) == revision_from_server_info(real) is None
    for key in ("reasoning_parser", "incremental_streaming_output", "stream_interval", "revision", "weight_version",
                "version", "frontend"):
        assert (key, sim[key]) == (key, real[key])
    for path in ("/get_server_info", "/server_info"):  # the old name is an alias on both
        assert HTTP.get(pair.sim + path).json()["stream_interval"] == HTTP.get(pair.real + path).json()[
            "stream_interval"]
    # Documented difference: the sim reports the context length as a server started with
    # --context-length would; a real server without it says null, and doctor reads /v1/models then.
    cards = {name: HTTP.get(url + "/v1/models").json() for name, url in pair.both()}
    assert wire_shape(cards["sim"]) == wire_shape(cards["real"])
    assert real["context_length"] is None
    assert sim["context_length"] == cards["sim"]["data"][0]["max_model_len"] == cards["real"]["data"][0][
        "max_model_len"]


def test_model_info_has_the_same_fields_but_the_embedding_plan(pair):
    real, sim = (HTTP.get(url + "/model_info").json() for _, url in pair.both())
    assert list(sim) == [key for key in real if key != "embedding"]  # documented: no embedding plan in the sim
    assert {k: shape(v) for k, v in sim.items() if v is not None} == {
        k: shape(v) for k, v in real.items() if k in sim and v is not None}
    assert (sim["weight_version"], sim["reasoning_parser"]) == (real["weight_version"], real["reasoning_parser"])
    real_identity, sim_identity = identity_from_model_info(real), identity_from_model_info(sim)
    assert sim_identity.weight_version == real_identity.weight_version == pair.weight_version
    assert sim_identity.name == sim["served_model_name"] and real_identity.name == real["served_model_name"]


def test_health_answers_200_with_an_empty_body_alike(one_pair):
    for path in ("/health", "/health_generate"):
        real, sim = (HTTP.get(url + path, timeout=30) for _, url in one_pair.both())
        assert (sim.status_code, sim.content) == (real.status_code, real.content) == (200, b"")


def test_abort_request_answers_200_with_an_empty_body_and_refuses_a_malformed_one_alike(one_pair):
    for body in ({"rid": "no-such-request"}, {}, {"abort_all": False}):
        real, sim = (HTTP.post(url + "/abort_request", json=body, timeout=10) for _, url in one_pair.both())
        assert (sim.status_code, sim.content, sim.headers.get("content-type")) == (
            real.status_code, real.content, real.headers.get("content-type")) == (200, b"", None)
    real, sim = (post(url, "/abort_request", {"rid": 5}) for _, url in one_pair.both())
    assert (sim.status, sim.content_type, list(sim.json())) == (real.status, real.content_type, list(real.json()))
    refusals = [(answer.json()["type"], answer.json()["code"]) for answer in (real, sim)]
    assert refusals == [("Bad Request", 400)] * 2


def test_v1_loads_has_the_fields_genfleet_reads_on_both(one_pair):
    """Workers read /v1/loads (workers/servers/sglang_info.py, `load_from_loads`): the sim answers it in
    the real server's shape, with the fields genfleet reads; the sim's KV is its slots."""
    real, sim = (HTTP.get(url + "/v1/loads").json() for url in (one_pair.real, one_pair.sim))
    assert list(real) == list(sim) == ["timestamp", "version", "accelerator", "num_accelerators", "loads"]
    read = {"dp_rank", "num_running_reqs", "num_waiting_reqs", "token_usage", "gen_throughput",
            "max_total_num_tokens", "max_running_requests", "queues"}
    assert read <= real["loads"][0].keys() and read <= sim["loads"][0].keys()
    assert {"waiting", "retracted"} <= real["loads"][0]["queues"].keys() & sim["loads"][0]["queues"].keys()
    for body in (real, sim):
        load_from_loads(body)
