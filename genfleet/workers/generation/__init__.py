"""Talking to SGLang: the HTTP client (`client`), request bodies (`requests`), stream assembly with
its integrity checks (`generate_stream`, `chat_stream`), what each server says about itself
(`server_info`), wire failures as typed errors (`wire_errors`), and the reasoning split (`split`)."""
