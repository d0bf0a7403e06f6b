"""The tiny model directory the real SGLang server loads: a Qwen3ForCausalLM config (one layer,
hidden size 64; `--load-format dummy` fills its weights, which the forward patch never reads) and
the simulator's byte-level BPE tokenizer, with `<think>` and `</think>` made ordinary added tokens,
as Qwen3's own tokenizer has them: not special, so they survive `skip_special_tokens`, which SGLang's
OpenAI chat serving leaves on (0.5.23 `entrypoints/openai/serving_chat.py`
`_patch_reasoning_skip_special_tokens` turns it off only for a few parsers) and its reasoning
parser still sees them. Token ids are the simulator's: no id moves.

Built into a directory on demand (`build(path)`); nothing is committed but this code.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM_MODEL = REPO / "sim" / "model"
NOT_SPECIAL = ("<think>", "</think>")
CONTEXT_LENGTH = 32768  # the long partition's 16,384 max_new_tokens fit with any test prompt


def qwen3_config(vocab_size: int, eos_id: int, bos_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "attention_bias": False,
        "use_sliding_window": False,
    }


def build(path: Path) -> Path:
    """Write the model directory at `path` (replacing what is there) and return it."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    tokenizer = json.loads((SIM_MODEL / "tokenizer.json").read_text())
    for token in tokenizer["added_tokens"]:
        if token["content"] in NOT_SPECIAL:
            token["special"] = False
    (path / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((SIM_MODEL / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = [t for t in config["additional_special_tokens"] if t not in NOT_SPECIAL]
    config["model_max_length"] = CONTEXT_LENGTH
    (path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    ids = {token["content"]: token["id"] for token in tokenizer["added_tokens"]}
    vocab_size = max(max(tokenizer["model"]["vocab"].values()), max(ids.values())) + 1
    (path / "config.json").write_text(json.dumps(qwen3_config(vocab_size, ids["<|im_end|>"], ids["[BOS]"]), indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids["<|im_end|>"]}))
    return path


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
