"""`genfleet run`'s life, in the foreground: Redis (the one named, else the embedded one), the short
and long pools (`genfleet worker`, the same workers a fleet runs), the producer (`genfleet enqueue`)
beside them, progress until every prompt is settled, the summary and the exit status.

- **Ending.** The job ends once the producer has exited 0 and every enqueued prompt is done,
  dead-lettered or skipped. Exit 0 if none failed, 1 otherwise (with the `failures` / `requeue`
  commands to run); the producer's own status if it refused (2: a bad flag, 1: nothing to do).
- **Stopping.** The first Ctrl-C or SIGTERM stops the producer (each batch is published whole, so
  a re-run resumes), then the workers: their running streams get `shutdown_grace_s` to finish, the
  rest go back to the queue (`workers/lifecycle.py`). Redis stops last, writing out its AOF. A
  second signal kills the children at once (Redis still writes its AOF).
- **Resuming.** The same command again reuses the embedded Redis's data: nothing done is generated
  again. After `kill -9` of the whole tree (the children die with it: `processes.py`), the AOF holds
  all but the last second, and the producer settles what the shards hold before it publishes.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

import redis
from rich.console import Console, Group
from rich.markup import escape

from genfleet.common.keys import ManifestFields
from genfleet.common.queues import DEFAULT_METRICS_PORTS, PARTITIONS
from genfleet.common.reasoning import get_format
from genfleet.common.run_state import RunManifest, connect
from genfleet.common.settings import Settings, printable_url
from genfleet.onebox.embedded_redis import EmbeddedRedis, EmbeddedRedisError, Listen
from genfleet.onebox.processes import ChildFailed, Processes, free_port, genfleet, port_is_free, wait_for
from genfleet.status.read_model import DatasetProgress, RunProgress, RunStatus, read_progress, read_status
from genfleet.status.render import ProgressLog, progress_bars, render
from genfleet.workers.servers.api import ServerDescription

# The end is noticed within this (the counters alone: `read_progress`); the full status, which costs
# more Redis round trips, is read only to be shown: each second on a terminal, else each line.
POLL_S = 0.1
LIVE_REFRESH_S = 1.0
REDIS_TIMEOUT_S = 10.0
# Lines of the producer's log shown when it ends (the rest stay in the file).
ENQUEUE_LOG_LINES = 60


@dataclass(frozen=True)
class JobPlan:
    run: str
    upstreams: tuple[str, ...]
    out: Path
    enqueue_args: tuple[str, ...]  # `genfleet enqueue` arguments, every one the user gave
    redis_url: str | None  # named by the user (flag, run file or GENFLEET_REDIS_URL); None: embedded
    tokenizer: str | None = None
    trust_remote_code: bool = False  # the workers may run the tokenizer's own code, as the producer
    concurrency: dict[str, int | None] = field(default_factory=lambda: {"short": None, "long": None})
    in_flight: str | None = None
    api: str | None = None
    listen: Listen | None = None
    flower_port: int | None = None
    serve_port: int | None = None
    progress_every_s: float = 30.0
    export_format: str | None = None
    export_to: Path | None = None
    context_length_given: bool = False  # else the server's context, when it says, is the producer's
    # Servers the job starts itself, (name, command line): the demo's simulator. They start before
    # anything asks them for work and stop after the workers, whose streams they serve to the end.
    servers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    hold: bool = False  # after the summary, keep everything up (Flower, the status page) until Ctrl-C


@contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """SIGTERM, as SIGINT, raises KeyboardInterrupt in the main thread; yields the signals received
    so far, so the job tells a first one (stop gracefully) from a second (stop at once)."""
    asked: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        asked.append(signum)
        if len(asked) <= 2:  # a third, while Redis writes out its AOF, changes nothing
            raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield asked
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class Job:
    def __init__(self, plan: JobPlan, console: Console) -> None:
        self.plan, self.console = plan, console
        self.out = plan.out.resolve()
        self.logs = self.out / "logs" / plan.run
        self.embedded = None if plan.redis_url else EmbeddedRedis(self.out)
        self.settings = Settings()
        self.processes: Processes | None = None
        self.servers: Processes | None = None  # plan.servers, stopped after self.processes
        self.enqueue_reported = False
        self.progress_log = ProgressLog()  # the plain lines without a terminal: what changed since the last
        self.parser_source = ""
        self.job_lock: IO[str] | None = None  # this job's hold on its output directory
        self.before: DatasetProgress | None = None  # the run's totals when this job started
        self.metrics = self._metrics_ports()
        self.pools_started: set[str] = set()
        self.held = False  # the run ended and the job holds (`plan.hold`)
        self.started = time.monotonic()

    def run(self) -> int:
        """The job, start to end; returns the exit status."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with _stop_signals() as asked:
            try:
                return self._run()
            except ChildFailed as failure:  # a child that did not come up, or exited before the end
                self.console.print(f"[red]error:[/] {escape(str(failure))}", soft_wrap=True)
                self._print_log_tail(failure)
                self._stop_children()
                return 1
            except KeyboardInterrupt:
                return self._stop(asked)
            finally:
                self._release_redis()

    def _run(self) -> int:
        plan = self.plan
        url = self._start_redis()
        client = connect(url, timeout_s=REDIS_TIMEOUT_S)
        self._start_servers()
        description = self._describe_server()
        recorded = self._recorded_parser(client)
        env = self._child_env(url, description, recorded)
        progress = read_progress(client, plan.run)
        self.before = progress.totals()
        self.processes = processes = Processes(self.logs, env)
        self._start_pool("short")
        # The producer reads the job's Redis from GENFLEET_REDIS_URL (the job picked it as the producer
        # would: the run file's, else the environment's), never from its command line, where `ps`
        # would show the embedded Redis's password.
        enqueue = processes.start("enqueue", *genfleet("enqueue", *plan.enqueue_args, *self._context_args(description)))
        flower_auth = self._start_watchers(processes, env)
        self._print_header(url, self.metrics, flower_auth, env)
        if self.embedded is not None and progress.unacked:
            self._note_held_by_a_killed_job(progress.unacked)
        status = self._watch(client, enqueue)
        if status is None:  # the producer refused or failed: its words are above
            self._stop_children()
            if "--new-run" in self.processes.output("enqueue"):
                self.console.print("genfleet run: to keep both configs, run this one under another --run name")
            return enqueue.returncode or 1
        if plan.hold:
            self._summary(status, None)
            self._hold()
        self._stop_children()
        exported = self._export()
        return self._summary(status, exported)

    # --- start ------------------------------------------------------------------------------
    def _start_redis(self) -> str:
        if self.embedded is None:
            assert self.plan.redis_url is not None
            return self.plan.redis_url
        self.job_lock = self.embedded.claim_job()
        if self.job_lock is None:
            raise EmbeddedRedisError(f"another genfleet run is using {self.out}: one job per output directory "
                                     "(they would share its queues); give this one its own --out")
        endpoint = self.embedded.start(self.plan.listen)
        return self.embedded.url(endpoint)

    def _start_servers(self) -> None:
        """The plan's own servers, each up (answering its health check) before the job goes on."""
        if not self.plan.servers:
            return
        from genfleet.workers.servers.kinds import AnyServer

        self.servers = servers = Processes(self.logs, {**os.environ, "PYTHONUNBUFFERED": "1"})
        for name, command in self.plan.servers:
            servers.start(name, *command)
        probe = AnyServer(max_connections=2, connect_timeout_s=2.0, stall_timeout_s=5.0)

        def up() -> bool:
            servers.check_alive()  # one that exits says so now, with its log
            return all(probe.health(url, timeout_s=2.0).reachable for url in self.plan.upstreams)

        try:
            wait_for(up, "the job's " + ", ".join(name for name, _ in self.plan.servers))
        finally:
            probe.close()

    def _describe_server(self) -> ServerDescription | None:
        """What the first upstream says of itself (its reasoning parser and context), or None."""
        from genfleet.workers.servers.kinds import AnyServer

        server = AnyServer(max_connections=2, connect_timeout_s=5.0, stall_timeout_s=10.0)
        try:
            for url in self.plan.upstreams:
                if not server.health(url, timeout_s=5.0).reachable:
                    self.console.print(f"[yellow]warning:[/] {escape(url)} does not answer: its workers wait for it "
                                       "(status shows it down) and nothing is generated there until it does",
                                       soft_wrap=True)
            return server.describe(self.plan.upstreams[0])
        except Exception as error:  # noqa: BLE001 - any failure: the workers wait for it, retrying
            self.console.print(f"[yellow]note:[/] {escape(self.plan.upstreams[0])} did not describe itself "
                               f"({escape(str(error) or type(error).__name__)})", soft_wrap=True)
            return None
        finally:
            server.close()

    def _recorded_parser(self, client: redis.Redis) -> str | None:
        """The reasoning parser a run already enqueued was recorded with (None: a new run): a
        resumed job splits as its first part did, whatever the server says now."""
        try:
            config = json.loads(RunManifest(client, self.plan.run).fields().get(ManifestFields.CONFIG, "{}"))
        except ValueError:
            return None
        parser = config.get("reasoning_parser")
        return parser if isinstance(parser, str) else None

    def _child_env(self, url: str, description: ServerDescription | None, recorded: str | None) -> dict[str, str]:
        env = {**os.environ, "GENFLEET_REDIS_URL": url, "GENFLEET_OUTPUT_DIR": str(self.out),
               "PYTHONUNBUFFERED": "1", "COLUMNS": str(max(self.console.width, 100))}
        if "reasoning_parser" in self.settings.model_fields_set:
            return env  # the user's choice; the producer refuses it if the run was enqueued with another
        if recorded is not None:
            env["GENFLEET_REASONING_PARSER"] = recorded
            self.parser_source = "the run's, as enqueued"
            return env
        parser = description.reasoning_parser if description else None
        if description is not None and description.kind == "vllm" and not parser:
            self.console.print(f"[yellow]note:[/] vLLM does not say which reasoning parser it runs: splitting with "
                               f"{self.settings.reasoning_parser!r} (set GENFLEET_REASONING_PARSER to the one "
                               "vLLM was given)", soft_wrap=True)
        if parser:
            try:
                get_format(parser)
            except ValueError:
                self.console.print(f"[yellow]note:[/] the server splits reasoning with {escape(parser)!r}, which "
                                   f"genfleet does not know; using {self.settings.reasoning_parser!r} "
                                   "(set GENFLEET_REASONING_PARSER to choose)", soft_wrap=True)
            else:
                # The parser is part of the run's config: the producer records it, the workers split with it.
                env["GENFLEET_REASONING_PARSER"] = parser
                self.parser_source = "the server's"
        return env

    def _context_args(self, description: ServerDescription | None) -> tuple[str, ...]:
        """The server's context for the producer's check, unless the user gave one."""
        if self.plan.context_length_given or description is None or not description.context_length:
            return ()
        return ("--context-length", str(description.context_length))

    def _metrics_ports(self) -> dict[str, int]:
        """Each pool's usual port (what a Prometheus scrape config names) while it is free;
        GENFLEET_METRICS_PORT=0 turns both off."""
        if self.settings.metrics_port == 0:
            return {pool: 0 for pool in PARTITIONS}
        return {pool: DEFAULT_METRICS_PORTS[pool] if port_is_free(DEFAULT_METRICS_PORTS[pool]) else free_port()
                for pool in PARTITIONS}

    def _start_pool(self, pool: str) -> None:
        assert self.processes is not None
        plan = self.plan
        args = ["--pool", pool, "--metrics-port", str(self.metrics[pool]), "--loglevel", "WARNING"]
        args += [arg for url in plan.upstreams for arg in ("--upstream", url)]
        if plan.concurrency.get(pool) is not None:
            args += ["--concurrency", str(plan.concurrency[pool])]
        for flag, value in (("--in-flight", plan.in_flight), ("--api", plan.api), ("--tokenizer", plan.tokenizer)):
            if value is not None:
                args += [flag, value]
        if plan.trust_remote_code:
            args.append("--trust-remote-code")
        self.processes.start(f"worker-{pool}", *genfleet("worker", *args))
        self.pools_started.add(pool)

    def _start_long_pool_when_due(self, progress: RunProgress) -> None:
        """The long pool starts with the first prompt on the long queue (enqueued long, a
        continuation, or one a killed worker held): a job without long prompts never pays for a
        second Celery worker, whose start takes seconds of a core on a small machine, taken from
        the server and the short pool beside it."""
        if "long" not in self.pools_started and progress.queued.get("long", 0) > 0:
            self._start_pool("long")

    def _start_watchers(self, processes: Processes, env: dict[str, str]) -> str | None:
        """Flower (`--flower`) and the status page (`--serve`); returns Flower's user:password."""
        auth = None
        if self.plan.flower_port is not None:
            auth = env.get("GENFLEET_FLOWER_AUTH") or f"genfleet:{secrets.token_hex(8)}"
            env["GENFLEET_FLOWER_AUTH"] = auth
            processes.start("flower", *genfleet("flower", "--port", str(self.plan.flower_port)))
        if self.plan.serve_port is not None:
            processes.start("status-page", *genfleet("status", "--run", self.plan.run, "--serve",
                                                     str(self.plan.serve_port)))
        return auth

    def _print_header(self, url: str, metrics: dict[str, int], flower_auth: str | None, env: dict[str, str]) -> None:
        plan, say = self.plan, self.console.print
        where = (f"embedded Redis in {self.embedded.directory}" if self.embedded else printable_url(url))
        say(f"[bold]genfleet run[/] [cyan]{escape(plan.run)}[/] · {', '.join(map(escape, plan.upstreams))} · "
            f"{escape(where)}", soft_wrap=True)
        say(f"shards: {escape(str(self.out / plan.run))} · logs: {escape(str(self.logs))} · metrics: "
            + (" · ".join(f"{pool} :{port}" for pool, port in metrics.items()) if all(metrics.values()) else "off")
            + " (the long pool starts with the first long prompt)", soft_wrap=True)
        if self.parser_source:
            say(f"reasoning parser: {env['GENFLEET_REASONING_PARSER']} ({self.parser_source})")
        if plan.flower_port is not None:
            say(f"Flower: http://127.0.0.1:{plan.flower_port} (user:password {escape(flower_auth or '')})")
        if plan.serve_port is not None:
            say(f"status page: http://127.0.0.1:{plan.serve_port}/")
        if plan.listen is not None and self.embedded is not None:
            self._print_fleet_lines(env)
        say("Ctrl-C stops (in-flight prompts finish or go back to the queue; the same command resumes)")

    def _print_fleet_lines(self, env: dict[str, str]) -> None:
        """The exact commands that make another host a worker of this job, and watch it from anywhere."""
        assert self.embedded is not None and self.plan.listen is not None
        endpoint = self.embedded.running()
        assert endpoint is not None
        host = self.plan.listen.address
        if host in ("0.0.0.0", "::"):
            host = socket.getfqdn()
        remote = self.embedded.url(endpoint, host=host)
        prefix = (f"GENFLEET_REASONING_PARSER={env['GENFLEET_REASONING_PARSER']} "
                  if "GENFLEET_REASONING_PARSER" in env else "")
        flags = [arg for url in self.plan.upstreams for arg in ("--upstream", url)]
        for flag, value in (("--in-flight", self.plan.in_flight), ("--api", self.plan.api),
                            ("--tokenizer", self.plan.tokenizer)):
            if value is not None:
                flags += [flag, value]
        self.console.print("another host joins this job with these (its shards stay on that host: export with a --from "
                           "for each; the --tokenizer directory must be there too):", soft_wrap=True)
        for pool in ("short", "long"):
            line = shlex.join(["genfleet", "worker", "--pool", pool, *flags, "--redis-url", remote])
            self.console.print(f"  {prefix}{line}", soft_wrap=True, markup=False, highlight=False)
        self.console.print("and watches it with:")
        self.console.print("  " + shlex.join(["genfleet", "status", "--run", self.plan.run, "--redis-url", remote]),
                           soft_wrap=True, markup=False, highlight=False)

    # --- progress ---------------------------------------------------------------------------
    def _watch(self, client: redis.Redis, enqueue: subprocess.Popen) -> RunStatus | None:
        """Progress until the job ends: returns its last status, or None if the producer failed."""
        if self.console.is_terminal:
            from rich.live import Live

            with Live(console=self.console, refresh_per_second=1, vertical_overflow="ellipsis") as live:
                return self._until_the_end(client, enqueue, LIVE_REFRESH_S,
                                           lambda status: live.update(Group(progress_bars(status), render(status))))
        return self._until_the_end(client, enqueue, self.plan.progress_every_s, self._print_lines)

    def _until_the_end(self, client: redis.Redis, enqueue: subprocess.Popen, every_s: float,
                       show: Callable[[RunStatus], None]) -> RunStatus | None:
        """Polls until the producer has exited 0 and every enqueued prompt is settled (returns the
        status then) or the producer failed (None); shows the status every `every_s` seconds."""
        assert self.processes is not None
        next_shown = time.monotonic()
        while True:
            self._check_alive()
            produced = enqueue.poll()
            if produced is not None and not self.enqueue_reported:
                self.enqueue_reported = True
                self._print_enqueue_log()
            if produced not in (None, 0):
                return None
            try:
                progress = read_progress(client, self.plan.run)
                self._start_long_pool_when_due(progress)
                ended = produced == 0 and progress.finished
                if ended or time.monotonic() >= next_shown:
                    status = read_status(client, self.plan.run)
                    show(status)
                    if ended:
                        return status
                    next_shown = time.monotonic() + every_s
            except redis.RedisError as error:
                raise ChildFailed(f"Redis: {error or type(error).__name__}") from None
            time.sleep(POLL_S)

    def _print_lines(self, status: RunStatus) -> None:
        for line in self.progress_log.lines(status, time.strftime("%H:%M:%S")):
            self.console.print(line, soft_wrap=True, markup=False, highlight=False)

    def _note_held_by_a_killed_job(self, held: int) -> None:
        """Prompts held by workers that died with an earlier job (`kill -9`) wait out their lease
        (`workers/delivery.py`): a job that starts with messages unacked says why it seems to idle."""
        self.console.print(f"note: {held:,} prompts are held by workers of an earlier job that did not stop (killed?): "
                           f"they come back as their leases expire, within {self.settings.lease_ttl_s:.0f} s",
                           soft_wrap=True)

    def _print_enqueue_log(self) -> None:
        assert self.processes is not None
        path = self.processes.log("enqueue")
        lines = self.processes.output("enqueue").splitlines()
        if len(lines) > ENQUEUE_LOG_LINES:
            self.console.print(f"(the producer's first {len(lines) - ENQUEUE_LOG_LINES} lines: {path})")
        for line in lines[-ENQUEUE_LOG_LINES:]:
            self.console.print(line, soft_wrap=True, markup=False, highlight=False)

    def _print_log_tail(self, failure: ChildFailed) -> None:
        for processes in self._groups():
            for name, _ in processes.children:
                if f"{name} exited" in str(failure):
                    for line in processes.output(name).splitlines()[-20:]:
                        self.console.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)

    # --- end --------------------------------------------------------------------------------
    def _groups(self) -> list[Processes]:
        """The job's children in the order they stop: the producer, the pools and the watchers, then
        the job's own servers, which serve the pools' streams to the end."""
        return [group for group in (self.processes, self.servers) if group is not None]

    def _check_alive(self) -> None:
        """A child that exits before the end (the producer excepted: its end is its own) ends the job."""
        for group in self._groups():
            group.check_alive(ignoring=("enqueue",))

    def _hold(self) -> None:
        """Until Ctrl-C or SIGTERM (the KeyboardInterrupt `run` handles), or until a child exits."""
        what = (f"Flower http://127.0.0.1:{self.plan.flower_port} · " if self.plan.flower_port is not None else "")
        self.held = True
        self.console.print(f"{what}everything stays up: Ctrl-C to stop")
        while True:
            self._check_alive()
            time.sleep(1.0)

    def _stop_children(self) -> None:
        """The producer and the workers, which finish or give back their streams within the grace;
        then the job's own servers."""
        for group in self._groups():
            group.stop_all(grace_s=self.settings.shutdown_grace_s + 5.0)

    def _release_redis(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()
        if self.job_lock is not None:
            self.job_lock.close()

    def _stop(self, asked: list[int]) -> int:
        """After a first signal: the producer and the workers stop within the grace; after a second,
        at once. Returns 128 + the first signal's number, as a shell reports a death by it."""
        first = asked[0] if asked else signal.SIGINT
        if len(asked) <= 1:
            if self.held:  # the run had ended: no prompt is running
                self.console.print(f"\n{signal.Signals(first).name}: stopping")
            else:
                self.console.print(f"\n{signal.Signals(first).name}: stopping; running prompts finish or go back "
                                   f"to the queue (up to {self.settings.shutdown_grace_s:.0f} s); again to stop at "
                                   "once. The same command resumes.")
            try:
                self._stop_children()
                return 128 + first
            except KeyboardInterrupt:
                pass
        self.console.print("stopping at once")
        for group in self._groups():
            group.kill_all()
        return 128 + first

    def _export(self) -> int | None:
        """`--export FORMAT --export-to DIR`: `genfleet export`'s exit status, or None if not asked."""
        plan = self.plan
        if plan.export_format is None or plan.export_to is None:
            return None
        assert self.processes is not None
        command = genfleet("export", "--run", plan.run, "--from", str(self.out), "--out", str(plan.export_to),
                           "--format", plan.export_format)
        return subprocess.run(command, env=self.processes.env).returncode

    def _summary(self, status: RunStatus, exported: int | None) -> int:
        totals = status.progress.totals()
        elapsed = time.monotonic() - self.started
        tokens = totals.completion_tokens - (self.before.completion_tokens if self.before else 0)
        done_now = totals.done - (self.before.done if self.before else 0)
        say = self.console.print
        say(f"[green]done[/]: {totals.done:,} prompts, {totals.failed:,} failed, {totals.skipped:,} skipped, "
            f"{totals.rejected:,} rows rejected; this job: {done_now:,} prompts, {tokens:,} completion tokens in "
            f"{elapsed:,.1f} s ({tokens / max(elapsed, 1e-9):,.0f} tok/s)", soft_wrap=True)
        say(f"shards: {escape(str(self.out / self.plan.run))}")
        if exported is not None:
            say(f"export: {escape(str(self.plan.export_to))} (genfleet export exited {exported})")
        prefix = self._command_prefix()
        if totals.failed:
            say(f"[red]{totals.failed:,} prompts failed[/]: see why with `{prefix}genfleet failures --run "
                f"{self.plan.run}`, fix the cause, then `{prefix}genfleet requeue --run {self.plan.run}` and run "
                "this command again", soft_wrap=True)
            return 1
        return 0 if exported in (None, 0) else exported

    def _command_prefix(self) -> str:
        """What a later command needs to find this job's Redis: nothing in the same directory."""
        if self.embedded is None or self.out == Settings().output_dir.resolve():
            return ""
        return f"GENFLEET_OUTPUT_DIR={shlex.quote(str(self.out))} "


def run_job(plan: JobPlan) -> int:
    console = Console(highlight=False)
    if not sys.stdout.isatty():
        console = Console(highlight=False, width=max(console.width, 120))
    return Job(plan, console).run()
