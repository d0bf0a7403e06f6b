"""The shard writer: a line is on disk when write() returns; shards seal and rotate by size."""
import threading

from helpers.waits import wait_until

from genfleet.workers.output import ShardSet, ShardWriter


def test_written_lines_are_on_disk_before_write_returns(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.01)
    writer.write(b'{"id": 1}\n')
    assert writer.open_path.read_bytes() == b'{"id": 1}\n'
    writer.close()


def test_many_threads_share_group_commits_and_lose_nothing(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.02)
    threads = [threading.Thread(target=writer.write, args=(f'{{"id": {i}}}\n'.encode(),)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    (shard,) = tmp_path.glob("*.jsonl")
    assert sorted(shard.read_text().splitlines()) == sorted(f'{{"id": {i}}}' for i in range(200))


def test_shards_rotate_by_size_and_seal_on_close(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=50, commit_interval_s=0.001)
    for _ in range(10):
        writer.write(b"x" * 30 + b"\n")
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "w1-00000.jsonl" and not any(n.endswith(".open") for n in names)
    assert sum(len(p.read_bytes()) for p in tmp_path.iterdir()) == 310


def test_a_restarted_worker_never_overwrites_earlier_shards(tmp_path):
    first = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001)
    first.write(b"a\n")  # left open, as after a crash
    second = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001)
    second.write(b"b\n")
    second.close()
    assert (tmp_path / "w1-00000.jsonl.open").read_bytes() == b"a\n"
    assert (tmp_path / "w1-00001.jsonl").read_bytes() == b"b\n"


def test_shard_set_lays_out_run_and_dataset_directories(tmp_path):
    shards = ShardSet(tmp_path, "short-host-1", max_bytes=1 << 20, commit_interval_s=0.001)
    shards.write("r1", "B1_glaive", b"{}\n")
    shards.close()
    assert (tmp_path / "r1" / "B1_glaive" / "short-host-1-00000.jsonl").exists()


def test_an_idle_shard_is_sealed_once_it_is_old_enough(tmp_path):
    writer = ShardWriter(tmp_path, "w1", max_bytes=1 << 20, commit_interval_s=0.001, max_age_s=0.3)
    writer.write(b"a\n")
    wait_until(lambda: (tmp_path / "w1-00000.jsonl").exists(), timeout=10, interval=0.05,
               message="the idle shard was not sealed")
    assert (tmp_path / "w1-00000.jsonl").read_bytes() == b"a\n"
    writer.write(b"b\n")  # goes to the next shard
    writer.close()
    assert (tmp_path / "w1-00001.jsonl").read_bytes() == b"b\n"
