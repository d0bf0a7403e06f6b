"""The tiny model directory vLLM's server loads: the SGLang tier's Qwen3ForCausalLM config and
tokenizer (tests/sglang_real/model_dir.py: the simulator's byte-level BPE, `<think>` and `</think>`
ordinary added tokens), made 2 layers of hidden size 128 with head_dim 32 (vLLM's CPU attention
takes no smaller head), and random float32 weights (seeded) in model.safetensors: greedy decoding
then writes varied text, multi-byte pieces included, where vLLM's `--load-format dummy` weights
repeat two tokens (the loop guard would cut every completion). vLLM's own output is the oracle, so
what the model says does not matter, only that it is deterministic.

Run by the tier's vLLM venv (it needs torch and transformers): `python model_dir.py PATH`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sglang_real"))

import model_dir as sglang_tier_model  # noqa: E402

CONTEXT_LENGTH = 4096
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": CONTEXT_LENGTH}
# Wide enough that the next token depends on the context (transformers' default 0.02 makes every
# logit about equal), seeded so that every build is the same model.
INIT_STD, SEED = 0.5, 0


def build(path: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sglang_tier_model.build(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **SHAPE}, indent=2))
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = CONTEXT_LENGTH
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False, indent=2))
    torch.manual_seed(SEED)
    hf_config = AutoConfig.from_pretrained(str(path), initializer_range=INIT_STD)
    AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32).save_pretrained(str(path))
    return path


# The looping model's shape: big enough that its streams take seconds (~75 tokens/s alone here),
# so that a request the worker cuts has most of its cap still to run when it is aborted.
LOOPING_SHAPE = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 8,
                 "num_key_value_heads": 4, "head_dim": 64}


def build_looping(model: Path, path: Path) -> Path:
    """`model`'s tokenizer with a bigger config and no weights, for `--load-format dummy`: vLLM's
    seeded dummy weights (`model_loader/weight_utils.py` `initialize_dummy_weights`) make it
    repeat two tokens from its first step."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (path / name).write_bytes((model / name).read_bytes())
    config = {**json.loads((model / "config.json").read_text()), **LOOPING_SHAPE}
    config.pop("layer_types", None)  # one per layer: transformers wrote the small model's
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


# The bench's model (bench/vllm_server.py): big enough that the server, not its client, bounds a run
# on this machine's cores (as a GPU server does), with random weights so that greedy decoding writes
# varied text, and BENCH_STOP_IDS more ids that end a completion (generation_config.json's
# `eos_token_id` list: vLLM 0.32.0 `sampling_params.py` `update_from_generation_config` stops on
# each), so that completions end at many lengths under the cap, not all at once in waves. Ten of
# them give a long tail, as reasoning completions have (150 greedy completions, cap 1,024: median
# 248 tokens, mean 339, p90 892, 13 at the cap; forty gave median 53, mean 72).
BENCH_SHAPE = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 8,
               "num_key_value_heads": 4, "head_dim": 64}
BENCH_STOP_IDS = list(range(600, 610))


def build_bench(path: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    build(path)
    config = json.loads((path / "config.json").read_text())
    config = {**config, **BENCH_SHAPE}
    config.pop("layer_types", None)  # one per layer: transformers wrote the small model's
    (path / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(SEED)
    hf_config = AutoConfig.from_pretrained(str(path), initializer_range=INIT_STD)
    AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32).save_pretrained(str(path))
    generation = json.loads((path / "generation_config.json").read_text())
    generation["eos_token_id"] = [config["eos_token_id"], *BENCH_STOP_IDS]
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path


if __name__ == "__main__":
    if sys.argv[1] == "--bench":
        print(build_bench(Path(sys.argv[2])))
    else:
        print(build(Path(sys.argv[1])))
