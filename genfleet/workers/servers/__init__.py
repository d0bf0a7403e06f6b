"""The seam between the worker and the server it generates on.

Everything that depends on the server's kind lives in this folder, behind `api.ServerApi`: the
request's wire shape, decoding a stream's chunks, what the server says about itself, its load, its
health and aborting a request. The rest of the worker speaks `api.py`'s terms only. Two kinds:
SGLang (`sglang.py`, `sglang_info.py`) and vLLM (`vllm.py`), each upstream's found by asking it
(`kinds.py`); what they share is `streaming.py`, and the HTTP transport under both `transport.py`.
"""
