"""Local faults under the shard writer: a full disk fails only the lines it struck, the writer
lives on with a fresh shard and no torn line; a shard that cannot be sealed never hangs a write."""
import os

import pytest
from helpers.tmpfs import fill, tmpfs
from helpers.waits import wait_until

from genfleet.workers.errors import ShardWriteFailed
from genfleet.workers.output import ShardSet, ShardWriter


def test_a_full_disk_fails_the_write_and_the_writer_recovers_once_there_is_room(tmp_path):
    with tmpfs(tmp_path / "disk", "256k") as disk:
        writer = ShardWriter(disk, "w1", max_bytes=1 << 20, commit_interval_s=0.001)
        writer.write(b'{"id": 0}\n')
        filler = fill(disk, leave_bytes=0)
        with pytest.raises(ShardWriteFailed, match="No space left"):
            writer.write(b'{"id": 1, "pad": "' + b"x" * 20000 + b'"}\n')
        filler.unlink()
        writer.write(b'{"id": 2}\n')  # the writer is not poisoned: a new shard takes it
        writer.close()
        lines = [line for shard in sorted(disk.glob("w1-*")) for line in shard.read_bytes().splitlines()]
        assert lines == [b'{"id": 0}', b'{"id": 2}']  # no torn half of the failed line anywhere


def test_a_shard_that_cannot_be_sealed_does_not_hang_the_next_write(tmp_path):
    # No seal until the shard is gone (a busy machine may take longer than a short age to get there).
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001, max_age_s=3600,
                         write_timeout_s=10)
    writer.write(b"a\n")
    os.unlink(writer.open_path)  # the idle seal's rename will fail: FileNotFoundError
    writer.max_age_s = 0.2
    wait_until(lambda: writer.open_path.name.startswith("w1-00001"), timeout=15, interval=0.05,
               message="the writer did not move past the shard it could not seal")
    writer.write(b"b\n")
    writer.close()
    assert (tmp_path / "w1-00001.jsonl").read_bytes() == b"b\n"


def test_a_write_never_waits_past_its_timeout(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=5.0, write_timeout_s=0.3)
    with pytest.raises(ShardWriteFailed, match="took over"):
        writer.write(b"a\n")  # the group commit waits 5 s: longer than this write may
    writer.close()


def test_a_shard_directory_that_cannot_be_made_is_a_write_failure(tmp_path):
    (tmp_path / "run").write_text("a file where the run's directory should be")
    shards = ShardSet(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001)
    with pytest.raises(ShardWriteFailed, match="cannot prepare"):
        shards.write("run", "ds", b"{}\n")


def test_a_write_after_shutdown_is_a_local_fault_not_the_prompts(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001)
    writer.close()
    with pytest.raises(ShardWriteFailed):  # the task gives its message back; no attempt counted
        writer.write(b"late\n")
