"""Tokenizer directories in the public shapes of the families users run, built here (nothing
downloads): each family's files, classes, special tokens and chat template as its repositories
have them, over a small vocabulary trained on `corpus.py`. `build(name, path)` writes one.

- kimi-k2.5: tiktoken.model, tokenization_kimi.py (named by auto_map), chat_template.jinja; the
  custom class TikTokenTokenizer (trust_remote_code, a slow Python tokenizer); the `thinking` kwarg;
- deepseek-r1: a byte-level tokenizer.json under LlamaTokenizerFast; the template writes BOS and the
  generation prompt opens `<think>\\n`;
- qwen3: tokenizer.json (NFC, digits split, byte-level), Qwen2Tokenizer; `enable_thinking`; `<think>`
  an ordinary (not special) token;
- glm-4.5: byte-level tokenizer.json; `[gMASK]<sop>` as literal text, `/nothink` and an empty
  `<think></think>` with enable_thinking false;
- gpt-oss: byte-level tokenizer.json; harmony channels, `reasoning_effort`;
- llama-2: SentencePiece's BPE in tokenizer.json (Prepend/Replace normalizer, byte fallback, a Strip
  decoder), LlamaTokenizerFast: a first output token whose space depends on the prompt before it.

Where each shape comes from (read through the library's search tool; hub files themselves were not
reachable): Kimi-K2's `tokenization_kimi.py` and `tokenizer_config.json` (moonshotai's repos as
vendored by third parties), its K2.5 template's `thinking` kwarg (thinking-machines-lab/tinker-cookbook
`renderers/kimi_k25.py`); DeepSeek-R1's updated template (llama.cpp
`models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja`); Qwen3's (`Qwen-Qwen3-0.6B.jinja`);
GLM-4.5's (`glm_4_5.jinja`); gpt-oss's harmony format (`openai-gpt-oss-120b.jinja`); Llama-2's
`tokenizer.json` (transformers `convert_slow_tokenizer.py`, `LlamaConverter`). The templates keep
each family's tokens, turn layout, generation prompt and thinking switch; tools and media are left
out (no test sends them).
"""
from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus import corpus  # noqa: E402

BASE_VOCAB = 2000
CONTEXT_LENGTH = 4096

# -- chat templates ---------------------------------------------------------------------------------

KIMI_TEMPLATE = (
    "{%- if thinking is not defined -%}{%- set thinking = true -%}{%- endif -%}"
    "{%- if messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set name = message.get('name') or message['role'] -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>{{ name }}<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|im_assistant|>{{ name }}<|im_middle|><think></think>{{ message['content'] }}<|im_end|>"
    "{%- else -%}<|im_system|>{{ name }}<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking -%}<think>{%- else -%}<think></think>{%- endif -%}{%- endif -%}"
)

DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = message['content'] -%}{%- endif -%}{%- endfor -%}"
    "{{ ns.system }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}<｜User｜>{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "<｜Assistant｜>{{ content }}<｜end▁of▁sentence｜>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<｜Assistant｜><think>\n{%- endif -%}"
)

QWEN3_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "<|im_start|>assistant\n{{ content }}<|im_end|>\n"
    "{%- else -%}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false -%}<think>\n\n</think>\n\n{%- endif -%}"
    "{%- endif -%}"
)

GLM45_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|system|>\n{{ message['content'] }}"
    "{%- elif message['role'] == 'user' -%}<|user|>\n{{ message['content'] }}"
    "{%- if enable_thinking is defined and not enable_thinking and loop.last -%}/nothink{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}<|assistant|>\n<think></think>\n{{ message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}\n<think></think>{%- endif -%}"
    "{%- endif -%}"
)

GPT_OSS_TEMPLATE = (
    "{%- if reasoning_effort is not defined -%}{%- set reasoning_effort = 'medium' -%}{%- endif -%}"
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: {{ reasoning_effort }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "<|start|>developer<|message|># Instructions\n\n{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'user' -%}<|start|>user<|message|>{{ message['content'] }}<|end|>"
    "{%- elif message['role'] == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message['content'] }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)

LLAMA2_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}[INST] <<SYS>>\n{{ message['content'] }}\n<</SYS>>\n\n"
    "{%- elif message['role'] == 'user' -%}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'system' -%}[INST] {% endif -%}"
    "{{ message['content'] }} [/INST]"
    "{%- elif message['role'] == 'assistant' -%}{{ ' ' + message['content'] + ' ' + eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def _kept_newlines(template: str) -> str:
    """Each newline of the template's text as an expression: Jinja's `{%-`/`-%}` would strip a
    literal one next to a tag, and the families' templates keep them."""
    return template.replace("\n", "{{ '\\n' }}")


KIMI_TEMPLATE, DEEPSEEK_TEMPLATE, QWEN3_TEMPLATE, GLM45_TEMPLATE, GPT_OSS_TEMPLATE, LLAMA2_TEMPLATE = map(
    _kept_newlines, (KIMI_TEMPLATE, DEEPSEEK_TEMPLATE, QWEN3_TEMPLATE, GLM45_TEMPLATE, GPT_OSS_TEMPLATE,
                     LLAMA2_TEMPLATE))

# -- vocabularies -----------------------------------------------------------------------------------


def byte_level_bpe(split: Regex | None, nfc: bool = False) -> Tokenizer:
    """A byte-level BPE (GPT-2's bytes-to-unicode alphabet), optionally after a regex split, trained
    on the corpus: the shape of Qwen3's, DeepSeek's, GLM's and gpt-oss's `tokenizer.json`."""
    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    steps = [pre_tokenizers.Split(split, behavior="isolated")] if split is not None else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


QWEN_SPLIT = Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def with_added(tokenizer: Tokenizer, special: list[str], ordinary: list[str] = ()) -> Tokenizer:
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ordinary])
    return tokenizer


def llama2_sentencepiece() -> Tokenizer:
    """Llama-2's `tokenizer.json` shape (transformers `LlamaConverter`, legacy): `<unk>` `<s>` `</s>`
    at 0-2, byte-fallback pieces `<0x00>`..`<0xFF>` at 3-258, BPE pieces over `▁`-joined text; the
    normalizer prepends `▁` and turns spaces into `▁`; the decoder turns them back, fuses bytes and
    strips one leading space, so a lone `▁word` decodes to "word" and after a prefix to " word"."""
    trainer_model = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_model.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_model.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, show_progress=False, special_tokens=["<unk>"])
    trainer_model.train_from_iterator(corpus(), trainer)
    trained = json.loads(trainer_model.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                                     fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    return tokenizer


# -- directories ------------------------------------------------------------------------------------


def _write_fast(path: Path, tokenizer: Tokenizer, config: dict) -> None:
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"model_max_length": CONTEXT_LENGTH, "clean_up_tokenization_spaces": False, **config},
        ensure_ascii=False, indent=2))


def _ids(tokenizer: Tokenizer, *tokens: str) -> dict[str, int]:
    return {t: tokenizer.token_to_id(t) for t in tokens}


def build_kimi(path: Path) -> dict:
    """tiktoken ranks from the byte-level BPE's vocabulary (rank = id; its merges were learnt in id
    order, so tiktoken's lowest-rank-first merging makes the same pieces), special ids from the rank
    count on at the family's offsets ([BOS] +0, [EOS] +1, <|im_end|> +2, ..., <|im_middle|> +17,
    <think> +22, </think> +23, [UNK] +254, [PAD] +255)."""
    trained = byte_level_bpe(None)
    alphabet = {v: k for k, v in _bytes_to_unicode().items()}
    vocab = trained.get_vocab()
    lines = [f"{base64.b64encode(bytes(alphabet[c] for c in piece)).decode()} {rank}"
             for piece, rank in sorted(vocab.items(), key=lambda item: item[1])]
    (path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    base = len(vocab)
    offsets = {"[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4,
               "<|start_header_id|>": 6, "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10,
               "<|tool_calls_section_begin|>": 11, "<|tool_calls_section_end|>": 12, "<|tool_call_begin|>": 13,
               "<|tool_call_argument_begin|>": 14, "<|tool_call_end|>": 15, "<|im_middle|>": 17,
               "<think>": 22, "</think>": 23, "[UNK]": 254, "[PAD]": 255}
    decoder = {str(base + offset): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": True}
               for token, offset in offsets.items()}
    shutil.copy(HERE / "kimi" / "tokenization_kimi.py", path / "tokenization_kimi.py")
    (path / "chat_template.jinja").write_text(KIMI_TEMPLATE)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "clean_up_tokenization_spaces": False, "model_max_length": CONTEXT_LENGTH,
        "tokenizer_class": "TikTokenTokenizer",
    }, indent=2))
    return {"vocab_size": base + 256, "bos": base, "eos": base + offsets["<|im_end|>"],
            "parser": "kimi_k2", "thinking_kwarg": "thinking", "trust_remote_code": True}


def build_deepseek_r1(path: Path) -> dict:
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    tokenizer = with_added(byte_level_bpe(QWEN_SPLIT), [bos, eos, "<｜User｜>", "<｜Assistant｜>"],
                           ["<think>", "</think>"])
    _write_fast(path, tokenizer, {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True,
                                  "add_eos_token": False, "legacy": True, "bos_token": bos, "eos_token": eos,
                                  "pad_token": eos, "unk_token": None, "chat_template": DEEPSEEK_TEMPLATE})
    # The model's own config.json beside it, as in the model's repository: its `model_type` is what
    # makes transformers 5.19 (both servers' pin) load this ByteLevel tokenizer.json as itself
    # (`TokenizersBackend`) and not as the LlamaTokenizer it names, which installs a Metaspace
    # pre-tokenizer and decoder (5.19 `models/auto/tokenization_auto.py`
    # `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS` lists `deepseek_v3`; transformers issue #45488).
    # Without it vLLM 0.32.0 tokenized every prompt differently and streamed 'ĠOut' for ' Out'.
    (path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                  "model_type": "deepseek_v3"}, indent=2))
    ids = _ids(tokenizer, bos, eos)
    return {"vocab_size": tokenizer.get_vocab_size(), "bos": ids[bos], "eos": ids[eos], "parser": "deepseek-r1",
            "thinking_kwarg": None}


def build_qwen3(path: Path) -> dict:
    tokenizer = with_added(byte_level_bpe(QWEN_SPLIT, nfc=True), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                           ["<tool_call>", "</tool_call>", "<think>", "</think>"])
    _write_fast(path, tokenizer, {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "add_bos_token": False,
                                  "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
                                  "chat_template": QWEN3_TEMPLATE})
    ids = _ids(tokenizer, "<|endoftext|>", "<|im_end|>")
    return {"vocab_size": tokenizer.get_vocab_size(), "bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"],
            "parser": "qwen3", "thinking_kwarg": "enable_thinking"}


def build_glm45(path: Path) -> dict:
    special = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
               "<|assistant|>", "<|observation|>"]
    tokenizer = with_added(byte_level_bpe(QWEN_SPLIT), special, ["<think>", "</think>"])
    _write_fast(path, tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                                  "pad_token": "<|endoftext|>", "chat_template": GLM45_TEMPLATE})
    ids = _ids(tokenizer, "<|endoftext|>", "<|user|>")
    return {"vocab_size": tokenizer.get_vocab_size(), "bos": ids["<|endoftext|>"], "eos": ids["<|user|>"],
            "parser": "glm45", "thinking_kwarg": "enable_thinking"}


def build_gpt_oss(path: Path) -> dict:
    special = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
               "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"]
    tokenizer = with_added(byte_level_bpe(QWEN_SPLIT), special)
    _write_fast(path, tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
                                  "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
                                  "chat_template": GPT_OSS_TEMPLATE})
    ids = _ids(tokenizer, "<|startoftext|>", "<|return|>")
    return {"vocab_size": tokenizer.get_vocab_size(), "bos": ids["<|startoftext|>"], "eos": ids["<|return|>"],
            "parser": "gpt-oss", "thinking_kwarg": None}


def build_llama2(path: Path) -> dict:
    tokenizer = llama2_sentencepiece()
    _write_fast(path, tokenizer, {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True,
                                  "add_eos_token": False, "legacy": True, "bos_token": "<s>", "eos_token": "</s>",
                                  "unk_token": "<unk>", "pad_token": None, "chat_template": LLAMA2_TEMPLATE})
    return {"vocab_size": tokenizer.get_vocab_size(), "bos": 1, "eos": 2, "parser": "none", "thinking_kwarg": None}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table (ByteLevel's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, (chr(c) for c in chars), strict=True))


SHAPES = {"kimi-k2.5": build_kimi, "deepseek-r1": build_deepseek_r1, "qwen3": build_qwen3, "glm-4.5": build_glm45,
          "gpt-oss": build_gpt_oss, "llama-2": build_llama2}


def build(name: str, path: Path) -> dict:
    """Write shape `name`'s tokenizer directory at `path`; returns its facts (vocab size, BOS and EOS
    ids, the reasoning parser, the thinking kwarg), also written to `shape.json` there."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    facts = {"shape": name, "trust_remote_code": False, **SHAPES[name](path)}
    (path / "shape.json").write_text(json.dumps(facts, indent=2))
    return facts


if __name__ == "__main__":
    for shape in sys.argv[2:] or SHAPES:
        print(json.dumps(build(shape, Path(sys.argv[1]) / shape)))
