"""The families' tokenizers (tests/model_shapes/shapes.py) as genfleet loads and templates them:
custom code only with trust_remote_code, prompt ids equal to each tokenizer's own
`apply_chat_template` + encode, and a completion decoded as the servers decode it, after the
prompt's last ids (workers/generation/completion_text.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.model_shapes import CONVERSATIONS, NAMES, facts, shape_dir, thinking_variants
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers.decoders import DecodeStream

from genfleet.common.tokenizer import CustomCodeRefused, load_tokenizer, tokenizer_kind
from genfleet.producer.prompts import PromptTemplater
from genfleet.workers.errors import IntegrityError
from genfleet.workers.generation.completion_text import PROMPT_CONTEXT_IDS, CompletionSplitter, decode_after
from genfleet.workers.servers.api import Generation


def _trusted(name: str) -> bool:
    return facts(name)["trust_remote_code"]


def test_a_custom_code_tokenizer_is_refused_without_the_flag_naming_its_file_and_the_flag():
    directory = shape_dir("kimi-k2.5")
    with pytest.raises(CustomCodeRefused) as refused:
        load_tokenizer(directory)
    message = str(refused.value)
    assert "tokenization_kimi.py" in message and "--trust-remote-code" in message and str(directory) in message
    assert "\n" not in message
    described = tokenizer_kind(directory).describe()
    assert described == "custom code tokenization_kimi.TikTokenTokenizer (tokenization_kimi.py)"
    assert type(load_tokenizer(directory, trust_remote_code=True)).__name__ == "TikTokenTokenizer"


@pytest.mark.parametrize("name", NAMES)
def test_prompt_ids_equal_the_tokenizers_own_template_and_encoding(name):
    """What the producer publishes is what `apply_chat_template(tokenize=True)` gives, for every
    conversation, thinking on and off."""
    templater = PromptTemplater(str(shape_dir(name)), trust_remote_code=_trusted(name))
    own = load_tokenizer(shape_dir(name), trust_remote_code=_trusted(name))
    for kwargs in thinking_variants(name):
        published = templater.render(CONVERSATIONS, kwargs)
        for conversation, ids in zip(CONVERSATIONS, published, strict=True):
            expected = own.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True,
                                               return_dict=False, **kwargs)
            assert ids == list(expected), (name, kwargs, conversation)


def test_the_thinking_switch_changes_kimis_generation_prompt():
    tokenizer = load_tokenizer(shape_dir("kimi-k2.5"), trust_remote_code=True)
    on, off = (tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True,
                                             thinking=value) for value in (True, False))
    assert on.endswith("<|im_assistant|>assistant<|im_middle|><think>") and off.endswith("<think></think>")


def _llama():
    return load_tokenizer(shape_dir("llama-2"))


def _prompt_ids(tokenizer) -> list[int]:
    return PromptTemplater(str(shape_dir("llama-2"))).render([CONVERSATIONS[1]])[0]


def test_a_space_joining_decoder_streams_the_first_tokens_space_and_the_check_expects_it():
    """Llama-2's Strip decoder: `▁word` alone decodes to "word", after the prompt to " word". The
    server sends the latter; the worker decodes after the same prompt ids, so the record keeps the
    space and the check passes (before, every such completion failed as an integrity error)."""
    tokenizer = _llama()
    prompt = _prompt_ids(tokenizer)
    ids = tokenizer("▁".join(["model", "answer", "think"]).replace("▁", " "), add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids[:1])[0].startswith("▁")
    context = tuple(prompt[-PROMPT_CONTEXT_IDS:])
    streamed = decode_after(tokenizer, context, ids, skip_special_tokens=False)
    assert streamed == " model answer think" and tokenizer.decode(ids) == "model answer think"
    generation = Generation(finish="length", prompt_tokens=len(prompt), completion_tokens=len(ids), reasoning_tokens=0,
                            cached_tokens=0, first_token_s=0.1, duration_s=1.0, text=streamed, output_ids=ids,
                            prompt_context=context)
    split = CompletionSplitter("none", tokenizer).split(generation, None)
    assert split.content == " model answer think"
    with pytest.raises(IntegrityError):  # without the prompt's ids in front, the space is not there
        CompletionSplitter("none", tokenizer).checked_text(
            Generation(**{**generation.__dict__, "prompt_context": ()}))


def _vllm_stream(tokenizer, prompt: list[int], ids: list[int]) -> str:
    """What vLLM 0.32.0's fast detokenizer streams, restated from its source
    (`v1/engine/detokenizer.py` `FastIncrementalDetokenizer._protected_step`): tokenizers'
    `DecodeStream` primed with the whole prompt, and a fresh stream where a step raises
    "Invalid prefix encountered"."""
    stream = DecodeStream(ids=prompt, skip_special_tokens=False)
    pieces = []
    for token in ids:
        try:
            pieces.append(stream.step(tokenizer._tokenizer, token) or "")
        except Exception as error:  # tokenizers raises a bare Exception
            if not str(error).startswith("Invalid prefix encountered"):
                raise
            stream = DecodeStream(skip_special_tokens=False)
            pieces.append(stream.step(tokenizer._tokenizer, token) or "")
    return "".join(pieces)


# Any id of the Llama-2 shape: its byte-fallback bytes (<0x00>..<0xFF>) included, whose lone or
# mismatched bytes make tokenizers' stream raise and vLLM's text leave them out.
ANY_IDS = st.lists(st.integers(min_value=0, max_value=2257), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(ANY_IDS, st.integers(min_value=0, max_value=len(CONVERSATIONS) - 1))
def test_the_check_accepts_what_vllms_decode_stream_sends_after_the_prompt(ids, which):
    """vLLM 0.32.0's fast detokenizer, restated chunk by chunk over the library's own `DecodeStream`,
    gives the text the worker must accept and record, for any output of the Llama-2 shape (before,
    a random model's lone byte dead-lettered its prompt on vLLM's own server)."""
    tokenizer = _llama()
    prompt = PromptTemplater(str(shape_dir("llama-2"))).render([CONVERSATIONS[which]])[0]
    streamed = _vllm_stream(tokenizer, prompt, ids)
    generation = Generation(finish="length", prompt_tokens=len(prompt), completion_tokens=len(ids), reasoning_tokens=0,
                            cached_tokens=0, first_token_s=0.1, duration_s=1.0, text=streamed, output_ids=ids,
                            prompt_context=tuple(prompt[-PROMPT_CONTEXT_IDS:]), decode_stream=True)
    assert CompletionSplitter("none", tokenizer).checked_text(generation) == streamed


def test_a_text_that_leaves_out_a_byte_passes_only_from_vllms_decode_stream():
    """The lone byte vLLM's stream drops (`<0x9C>` then `▁525`: its stream raises at `▁525`) is
    accepted from vLLM only: another server's text that leaves it out is still an integrity error."""
    tokenizer = _llama()
    prompt = _prompt_ids(tokenizer)
    ids = tokenizer.convert_tokens_to_ids(["<0x9C>", "▁525", "▁it?"])
    streamed = _vllm_stream(tokenizer, prompt, ids)
    context = tuple(prompt[-PROMPT_CONTEXT_IDS:])
    assert streamed == "525 it?"
    assert decode_after(tokenizer, context, ids, skip_special_tokens=False) == "\ufffd 525 it?"
    generation = Generation(finish="length", prompt_tokens=len(prompt), completion_tokens=len(ids), reasoning_tokens=0,
                            cached_tokens=0, first_token_s=0.1, duration_s=1.0, text=streamed, output_ids=ids,
                            prompt_context=context, decode_stream=True)
    assert CompletionSplitter("none", tokenizer).checked_text(generation) == "525 it?"
    with pytest.raises(IntegrityError):
        CompletionSplitter("none", tokenizer).checked_text(replace(generation, decode_stream=False))


def test_a_custom_code_tokenizer_templates_the_same_ids_in_processes():
    """The producer templates a Python tokenizer's batches in processes (templating_processes.py):
    the ids are the ones one interpreter gives, in the batch's order, thinking on and off."""
    conversations = [CONVERSATIONS[i % len(CONVERSATIONS)] for i in range(70)]
    directory = str(shape_dir("kimi-k2.5"))
    alone = PromptTemplater(directory, trust_remote_code=True)
    with PromptTemplater(directory, trust_remote_code=True, processes=2) as pooled:
        assert pooled._processes is None  # none before a batch worth splitting
        for kwargs in [*thinking_variants("kimi-k2.5"), *thinking_variants("kimi-k2.5")]:
            assert pooled.render(conversations, kwargs) == alone.render(conversations, kwargs)
        assert pooled._processes is not None  # a custom-code tokenizer: later batches went to the processes
