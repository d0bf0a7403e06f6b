"""Names vulture (`make lint`) cannot see used: read by a framework, by name or through `asdict`
(and two that only tests and the bench read, as the measure of a concept the product documents).
Each group says who reads them. Anything else unused is an error: delete it, don't list it here."""
# ruff: noqa
_ = object()

# Dataclass fields written out whole (`asdict` → JSON: the sim's /server_info and /sim/stats, a
# completion record and its loop finding, the status page's series, the bench's results, the
# oracle's cases).
requests_started, requests_finished, requests_disconnected  # sim/capacity.py CapacityStats
cached_tokens_total, prefill_tokens_computed, uptime_s  # sim/capacity.py CapacityStats
peak_running, mean_running, aborted_requests, tokens_generated  # sim/capacity.py CapacityStats
prompt_tokens_total, prefill_batches, prefill_busy_s  # sim/capacity.py CapacityStats
model_revision  # common/records.py CompletionRecord (`to_json_line`)
repeats  # workers/generation/loop_guard.py Loop (`to_dict`)
ago_min  # genfleet/status/read_model.py MinuteRate
tail_mean_running  # bench/shared_tail.py
chunking  # oracle/cases.py

# Settings read by name (`getattr(settings, f"loop_{name}")` in workers/generation/replies.py) and
# pydantic validators (run by pydantic, never called).
loop_max_period, loop_min_repeats, loop_min_span
_._verify_tls, _._split_upstreams, _._known_parser

# pydantic reads a model's `model_config` (common/settings.py, producer/run_config.py).
model_config

# prometheus_client calls a custom collector's `collect` at each scrape (workers/telemetry.py).
_.collect

# kombu 5.7.0 reads these on its QoS and Channel (workers/broker.py cites the lines).
restore_at_shutdown, _._in_poll, _._brpop_sent_at

# celery 5.7.0's `Consumer.on_close` reads a request's timer entry (tests/unit/test_leases.py).
_._eta_timer_entry

# SGLang 0.5.23's `Engine.__init__` reads the class field a subclass overrides (bench/sglang_offline.py).
run_scheduler_process_func

# The `tokenizers` library reads what sim/build_model.py assigns.
_.pre_tokenizer, _.decoder

# Read only by tests and the bench, as the documented measure of what the product does: the loop
# guard's detection bound (`LoopThresholds.latest`) and the test model's stop id, validated at load
# (`SimVocab.eos_id`; the simulator stops with each format's own stop marker).
_.latest, eos_id

# uvicorn's Server reads `should_exit` to stop (tests/helpers/task_harness.py).
_.should_exit

# `__exit__(*exc_info)`: the context-manager protocol.
exc_info

# The standard library and the test tools call these: http.server handlers, configparser,
# socketserver, selenium's options, pytest hooks, import machinery in the SGLang stand-ins.
_.do_GET, _.do_POST, _.log_message, _.close_connection, daemon_threads, _.optionxform
_.binary_location
pytest_collection_modifyitems, pytest_configure
__getattr__, _.__getattr__, _.__path__, _.create_module, _.exec_module

# `inspect.signature` (and so typer) reads a function's `__signature__` (genfleet/onebox/command.py).
_.__signature__

# The `genfleet` commands, imported by name when their command runs (genfleet/cli.py COMMANDS).
run_command, enqueue_command, worker_command, status_command, sim_command, flower_command
failures_command, requeue_command, recover_command, export_command, doctor_command, demo_command

# The Kimi-shaped stand-in tokenizer (tests/model_shapes/kimi/tokenization_kimi.py): transformers'
# AutoTokenizer loads the class named by auto_map and calls these by name; `normalizer` is a
# tokenizers.Tokenizer property, read by the library (tests/model_shapes/shapes.py).
TikTokenTokenizer, vocab_files_names, model_input_names, pad_id, _tokenize, _convert_token_to_id
_convert_id_to_token, convert_tokens_to_string, save_vocabulary, filename_prefix, save_directory, normalizer
