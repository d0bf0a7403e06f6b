"""Redis over TLS with a password, as deploy/redis.conf runs it: the broker verifies the server's
certificate by default (and refuses an unknown CA or a wrong password), and a real job runs over
the rediss:// URL: worker, producer and status."""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from helpers.certificates import make_certificates
from helpers.data import write_prompts
from helpers.fleet import Fleet
from helpers.paths import DEPLOY
from helpers.redis_server import pings
from helpers.sim_process import ONE_SECOND, SimProcess, free_port
from helpers.waits import wait_until

from genfleet.common.queues import SHORT
from genfleet.common.settings import Settings


@pytest.fixture
def tls_redis(tmp_path):
    certs = make_certificates(tmp_path)
    password = uuid.uuid4().hex
    auth = tmp_path / "auth.conf"
    auth.write_text(f"requirepass {password}\n")
    port = free_port()
    # deploy/redis.conf as deployed, the password from an included file, TLS only (no plain port).
    process = subprocess.Popen(
        ["redis-server", str(DEPLOY / "redis.conf"), "--include", str(auth), "--dir", str(tmp_path),
         "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(certs["cert"]),
         "--tls-key-file", str(certs["key"]), "--tls-ca-cert-file", str(certs["ca"]), "--tls-auth-clients", "no"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"rediss://:{password}@localhost:{port}/0?ssl_ca_certs={certs['ca']}"
    try:
        wait_until(lambda: pings(url) or process.poll() is not None, timeout=10,
                   message="the TLS redis-server did not start")
        if process.poll() is not None:
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            if "tls" in output.lower():
                pytest.skip(f"this redis-server has no TLS: {output[-300:]}")
            pytest.fail(f"redis-server did not start:\n{output}")
        yield url, certs, password, port
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_redis_tls_with_a_password_runs_a_job_and_the_broker_verifies_the_certificate(tls_redis, tmp_path):
    from genfleet.workers.lifecycle import create_app

    url, certs, password, port = tls_redis

    def broker_connects(redis_url: str, settings: Settings | None = None) -> bool:
        connection = create_app(settings or Settings(redis_url=redis_url)).connection_for_write()
        try:
            connection.ensure_connection(max_retries=0)
            connection.default_channel.client.ping()
            return True
        except Exception:  # noqa: BLE001 - any failure to connect or verify counts
            return False
        finally:
            connection.release()

    # The URL as documented: rediss://, the password, the private CA; verification is on by default.
    assert "ssl_cert_reqs=required" in Settings(redis_url=url).redis_url
    assert broker_connects(url)
    # A bare rediss:// URL: this server's certificate is not trusted by the system's CAs, so it must
    # be refused. kombu on its own would accept any certificate here (CERT_NONE, a log warning).
    bare = f"rediss://:{password}@localhost:{port}/0"
    unverified = Settings.model_construct(**{**Settings().model_dump(), "redis_url": bare})
    assert broker_connects(bare, unverified), "kombu verifies by itself now: the default can go"
    assert not broker_connects(bare)
    assert broker_connects(bare + "?ssl_cert_reqs=none"), "the explicit opt-out no longer works"
    assert not broker_connects(f"{bare}?ssl_ca_certs={certs['other_ca']}")
    assert not pings(f"rediss://:wrong@localhost:{port}/0?ssl_ca_certs={certs['ca']}")

    # A real job over it: worker, producer and status all on the rediss:// URL.
    (tmp_path / "fleet").mkdir()
    with Fleet(url, tmp_path / "fleet", metrics_port=0) as fleet, SimProcess(*ONE_SECOND) as sim:
        fleet.start_worker(SHORT, sim.url, concurrency=4)
        data_file = write_prompts(tmp_path / "tls.jsonl", 6, "a question over TLS")
        fleet.enqueue("tls", f"tls={data_file}")
        progress = fleet.wait_finished("tls", timeout=60)
        assert progress.totals().done == 6
        status = fleet.genfleet("status", "--run", "tls", "--json")
        assert json.loads(status.stdout)["run"] == "tls"
