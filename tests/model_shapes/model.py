"""A tiny random model for one shape's tokenizer directory, for vLLM's own server: the vLLM tier's
Qwen3ForCausalLM shape (tests/vllm_real/model_dir.py: 2 layers, hidden 128, head_dim 32, seeded
float32 weights wide enough that greedy decoding writes varied text) with the shape's vocabulary
size and its BOS and EOS ids. The architecture is not the family's (Kimi-K2 is a DeepSeek-V3 MoE):
what this tier proves is the tokenizer's and template's path through the server, which no layer
of the model touches.

Run by the vLLM venv (it needs torch and transformers): `python model.py DIR` over a directory
`shapes.py` wrote.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SHAPE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128,
         "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False,
         "torch_dtype": "float32"}
INIT_STD, SEED = 0.5, 0


def build(path: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    facts = json.loads((path / "shape.json").read_text())
    # The vocabulary is the tokenizer's, every id a piece it can decode (kimi's: its ranks and 256
    # special slots).
    config = {**SHAPE, "vocab_size": facts["vocab_size"], "bos_token_id": facts["bos"], "eos_token_id": facts["eos"]}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": facts["bos"], "eos_token_id": facts["eos"]}, indent=2))
    torch.manual_seed(SEED)
    hf_config = AutoConfig.from_pretrained(str(path), initializer_range=INIT_STD)
    AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32).save_pretrained(str(path))
    (path / "config.json").write_text(json.dumps(config, indent=2))  # save_pretrained rewrote it
    return path


if __name__ == "__main__":
    for directory in sys.argv[1:]:
        print(build(Path(directory)))
