"""The /generate stream assembler, chunk by chunk, for every mode SGLang streams in."""
import pytest

from genfleet.workers.errors import PermanentError, TransientError, UpstreamAborted
from genfleet.workers.servers.sglang import StreamAssembler

WORDS = [" a", " b", " c", " d", " e"]
IDS = [10, 11, 12, 13, 14]
STOP = {"type": "stop", "matched": 2}


def meta(count, finish=None, new_style=True):
    data = {"id": "r", "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": count,
            "cached_tokens": 0}
    if new_style:
        data.update(reasoning_tokens=0, num_retractions=0, weight_version="default")
    return data


def feed_all(chunks):
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler


def test_cumulative_chunks_are_replaced_not_appended():
    chunks = [{"text": "".join(WORDS[:n]), "output_ids": IDS[:n], "meta_info": meta(n)} for n in (1, 3)]
    chunks.append({"text": "".join(WORDS), "output_ids": IDS, "meta_info": meta(5, STOP)})
    assembler = feed_all(chunks)
    assert (assembler.text, assembler.output_ids, assembler.ids_cumulative) == ("".join(WORDS), IDS, True)
    assert assembler.finish_reason == STOP


def test_incremental_chunks_are_appended():
    chunks = [{"text": WORDS[0], "output_ids": IDS[:1], "meta_info": meta(1)},
              {"text": "".join(WORDS[1:3]), "output_ids": IDS[1:3], "meta_info": meta(3)},
              {"text": "".join(WORDS[3:]), "output_ids": IDS[3:], "meta_info": meta(5, STOP)}]
    assembler = feed_all(chunks)
    assert (assembler.text, assembler.output_ids, assembler.ids_cumulative) == ("".join(WORDS), IDS, False)


def test_sglang_052_cumulative_text_with_delta_ids():
    chunks = [{"text": WORDS[0], "output_ids": IDS[:1], "meta_info": meta(1, new_style=False)},
              {"text": "".join(WORDS[:3]), "output_ids": IDS[1:3], "meta_info": meta(3, new_style=False)},
              {"text": "".join(WORDS), "output_ids": IDS[3:], "meta_info": meta(5, STOP, new_style=False)}]
    assembler = feed_all(chunks)
    assert (assembler.text, assembler.output_ids) == ("".join(WORDS), IDS)


@pytest.mark.parametrize("error, expected", [
    ({"message": "CUDA error", "type": "internal_error", "code": 500, "retryable": True}, TransientError),
    ({"message": "bad", "type": "invalid_request_error", "code": 400, "retryable": False}, PermanentError),
    ({"message": "The input (9 tokens) is longer than the model's context length (8 tokens)."}, PermanentError),
    ({"message": "CUDA error: an illegal memory access was encountered"}, TransientError),  # 0.5.2 shape
    ({"object": "error", "message": "overloaded", "type": "InternalServerError", "param": None, "code": 503},
     TransientError),  # chat completions shape
])
def test_error_chunks_map_to_typed_errors(error, expected):
    with pytest.raises(expected):
        StreamAssembler().feed({"error": error})


def test_abort_503_is_retryable():
    finish = {"type": "abort", "message": "The request queue is full.", "status_code": 503, "err_type": None}
    with pytest.raises(UpstreamAborted) as caught:
        StreamAssembler().feed({"text": "", "output_ids": [], "meta_info": meta(0, finish)})
    assert caught.value.retryable
