"""The one piece of SGLang 0.5.23 this tier replaces: `ModelRunner.forward`, the model's forward
pass. Everything around it is SGLang's own: the HTTP server and TokenizerManager, the scheduler
(admission by `max_new_tokens` reservation, chunked prefill, the radix cache, retraction, abort),
the sampler with its penalties, the output streamer and the detokenizer.

The patched forward sees only what a model sees: the batch's new tokens, and the KV cache of the
tokens before them. It stores each token's id in its KV slot (the first two elements of layer 0's
key, as id % 256 and id // 256: exact in any float dtype SGLang's CPU engine uses) and reads a
request's whole sequence back through `req_to_token_pool`, so a prefix the radix cache shares is
read from the cache, as a real model's attention would. The next-token logits put all the
probability on the plan's token (`plan.Planner`); the sampler still runs on them.

When `GENFLEET_PLAN_COUNTERS` names a file, the patch keeps there (as JSON, rewritten at most every
0.2 s) what the scheduler made it compute: tokens decoded and tokens prefilled (the extend rows:
what the radix cache did not hold). That is the "GPU work" a benchmark charges, counted where it
happens instead of inferred from the responses.

When `GENFLEET_PLAN_STEP_S` is "A,B,C", each forward pass also sleeps A + B x (requests in the batch)
+ C x (tokens it prefills) seconds: a model of a GPU's step, whose decode time grows with the batch
and whose prefill is charged per token, on top of the CPU engine's own time. It is what makes a
batch the scheduler keeps small cost throughput, as on a GPU (the benchmark of admission,
`bench/admission.py`); the tests leave it unset.

A request's turn is found at each extend (prefill or chunk) and kept per `req_pool_index`; a decode
step only advances it. That keeps a step O(batch), not O(batch x length).

When `GENFLEET_PLAN_HASHED` is "1" there is no plan and no tier tokenizer: the next token is a
blake2b digest of the whole sequence so far, modulo the model's vocabulary. Any tokenizer of that
vocabulary can be served then (tests/sglang_real/test_model_shapes_on_sglang.py): its every id,
byte-fallback bytes and special tokens included, reaches SGLang's own detokenizer, and the same
prompt always gets the same completion, streamed or not.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from array import array
from pathlib import Path

import torch
from plan import Planner, PlanVocab, split_context

PLANNED_LOGIT = 100.0  # softmax puts ~1 - 3000 * e^-100 on the planned token at any temperature <= 1


class PlanForward:
    def __init__(self, model_dir: Path | str, vocab_size: int) -> None:
        self.hashed = os.environ.get("GENFLEET_PLAN_HASHED") == "1"
        self.vocab = None if self.hashed else PlanVocab.from_dir(model_dir)
        self.planner = None if self.hashed else Planner(self.vocab)
        self.vocab_size = vocab_size
        # req_pool_index -> (turn, the sequence it follows, where the turn starts in the sequence)
        self.active: dict[int, tuple] = {}
        counters = os.environ.get("GENFLEET_PLAN_COUNTERS")
        self.counters_path = Path(counters) if counters else None
        self.counts = {"decoded_tokens": 0, "prefilled_tokens": 0, "forward_passes": 0}
        self._written_at = 0.0
        step = os.environ.get("GENFLEET_PLAN_STEP_S")
        self.step_s = tuple(float(part) for part in step.split(",")) if step else None
        assert self.step_s is None or len(self.step_s) == 3, f"GENFLEET_PLAN_STEP_S={step}: want A,B,C seconds"

    def model_step(self, batch) -> None:
        """Sleep the modelled step time (the module's docstring)."""
        if self.step_s is None:
            return
        fixed, per_request, per_prefill_token = self.step_s
        prefill = 0 if batch.forward_mode.is_decode() else int(batch.input_ids.numel())
        time.sleep(fixed + per_request * batch.batch_size + per_prefill_token * prefill)

    def count(self, batch) -> None:
        if self.counters_path is None:
            return
        self.counts["forward_passes"] += 1
        if batch.forward_mode.is_decode():
            self.counts["decoded_tokens"] += batch.batch_size
        else:
            self.counts["prefilled_tokens"] += int(batch.input_ids.numel())
        now = time.monotonic()
        if now - self._written_at >= 0.2:
            self._written_at = now
            partial = self.counters_path.with_suffix(".partial")
            partial.write_text(json.dumps(self.counts))
            partial.replace(self.counters_path)

    def __call__(self, runner, forward_batch):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.model_runner import ModelRunnerOutput

        batch = forward_batch
        size = batch.batch_size
        logits = torch.zeros((size, self.vocab_size), dtype=torch.float32)
        if size == 0 or batch.forward_mode.is_idle():
            return ModelRunnerOutput(logits_output=LogitsProcessorOutput(next_token_logits=logits), can_run_graph=False)
        self.count(batch)
        self.model_step(batch)
        keys = runner.token_to_kv_pool.get_key_buffer(0)
        new_ids = batch.input_ids.to(torch.int64)
        locations = batch.out_cache_loc.to(torch.int64)
        keys[locations, 0, 0] = (new_ids % 256).to(keys.dtype)
        keys[locations, 0, 1] = (new_ids // 256).to(keys.dtype)
        seq_lens = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()).tolist()
        pool_indices = batch.req_pool_indices.cpu().tolist()
        rows = zip(pool_indices, seq_lens, strict=True)
        if self.hashed:
            next_ids = [self._hashed(runner, keys, index, seq_len) for index, seq_len in rows]
        elif batch.forward_mode.is_decode():
            next_ids = [self._decode(index, seq_len) for index, seq_len in rows]
        else:
            next_ids = [self._extend(runner, keys, index, seq_len) for index, seq_len in rows]
        logits[torch.arange(size), torch.tensor(next_ids)] = PLANNED_LOGIT
        return ModelRunnerOutput(logits_output=LogitsProcessorOutput(next_token_logits=logits), can_run_graph=False)

    def _sequence(self, runner, keys, pool_index: int, seq_len: int) -> list[int]:
        slots = runner.req_to_token_pool.req_to_token[pool_index, :seq_len].to(torch.int64)
        pairs = keys[slots, 0, :2].to(torch.int64)
        return (pairs[:, 0] + 256 * pairs[:, 1]).tolist()

    def _hashed(self, runner, keys, pool_index: int, seq_len: int) -> int:
        sequence = array("I", self._sequence(runner, keys, pool_index, seq_len)).tobytes()
        return int.from_bytes(hashlib.blake2b(sequence, digest_size=8).digest(), "little") % self.vocab_size

    def _extend(self, runner, keys, pool_index: int, seq_len: int) -> int:
        sequence = self._sequence(runner, keys, pool_index, seq_len)
        start = split_context(sequence, self.vocab)
        turn = self.planner.turn(sequence[:start])
        head = turn.head_for(sequence[start:])
        self.active[pool_index] = (turn, head, start)
        return self.vocab.eos if head is None else turn.token_at(head, seq_len - start)

    def _decode(self, pool_index: int, seq_len: int) -> int:
        """The sequence so far is the plan's (checked at the extend, and every token decoded since
        was the planned one: the logits leave the sampler no other choice), so only the position
        matters: `seq_len` counts the token this step feeds in."""
        turn, head, start = self.active.get(pool_index, (None, None, 0))
        return self.vocab.eos if head is None else turn.token_at(head, seq_len - start)


def install(model_dir: Path | str) -> None:
    """Replace `ModelRunner.forward` in this (the scheduler's) process."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    state: dict[str, PlanForward] = {}

    def forward(self, forward_batch, *args, **kwargs):
        plan = state.get("plan")
        if plan is None:
            plan = state["plan"] = PlanForward(model_dir, self.model_config.vocab_size)
        return plan(self, forward_batch)

    ModelRunner.forward = forward
