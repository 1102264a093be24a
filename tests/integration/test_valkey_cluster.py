"""The Valkey drain against the real embedded Valkey Cluster (three primaries, three replicas): a
pipeline's four streams on different primaries, a primary SIGKILLed and its replica promoted in the
middle of a drain, a stream's slot migrated while a drain holds its claims. Judged by reading the
Delta tables back."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import pytest

from deltadrain.catchup import drain
from deltadrain.config.embedded import VALKEY_CLUSTER_NODES
from deltadrain.dev.produce import generate, partition_for
from deltadrain.dev.services.valkey_cluster import _connect, known_nodes
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.sources.valkey.client import VALKEY_FIELD, valkey_client
from tests.support.processes import cli_drain, held_at, summary_of, wait_held
from tests.support.valkey import assert_exactly_once, drain_until_done, make_pipeline, pending

pytestmark = pytest.mark.slow


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports free on 127.0.0.1 (from a port the system chose)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


@pytest.fixture(scope="module")
def valkey_cluster(cfg):
    from deltadrain.dev import services

    os.environ["DELTADRAIN_VALKEY_CLUSTER_PORT"] = str(free_ports(2 * VALKEY_CLUSTER_NODES))
    svc = services.FACTORIES["valkey_cluster"](cfg)
    try:
        assert svc.up() == "started"
        yield svc
    finally:
        svc.down()
        del os.environ["DELTADRAIN_VALKEY_CLUSTER_PORT"]


def cluster_pipeline(tmp_path, **overrides):
    # No connection: the embedded cluster's own password, not the single Valkey's ACL user.
    return make_pipeline(tmp_path, source={"cluster": True, "connection_id": None}, min_idle_ms=1000,
                         batch_cap=100_000, **overrides)


def primary_of(client, stream: str) -> int:
    """The port of the primary that serves `stream`'s slot, as the cluster says it now."""
    return client.get_node_from_key(stream).port


def produce_acknowledged(client, pipeline, count: int, seed: int, start: int = 0,
                         importing: dict[str, int] | None = None, wait: bool = True) -> list[str]:
    """XADD `count` sample messages, each stream's on one connection to its primary followed by WAIT 1:
    the writes the primary acknowledged only once a replica has them. Returns the ids. `importing`:
    streams whose slot is migrating, to the port of the node they are on now (each XADD after ASKING).
    `wait=False`: acknowledged by the primary alone."""
    client.nodes_manager.initialize()  # this goes round the client's redirections: the slots as they are now
    streams = pipeline.source.streams
    by_stream: dict[str, list] = {s: [] for s in streams}
    for msg in generate(pipeline, count, seed, start=start):
        by_stream[streams[partition_for(msg.partition_key, len(streams))]].append(msg)
    for stream, msgs in by_stream.items():
        asking = stream in (importing or {})
        node = _connect(importing[stream]) if asking else client.get_node_from_key(stream).valkey_connection
        pipe = node.pipeline(transaction=False)
        for msg in msgs:
            if asking:
                pipe.execute_command("ASKING")
            pipe.xadd(stream, {VALKEY_FIELD: msg.value})
        if wait:
            pipe.execute_command("WAIT", 1, 10_000)
        replies = pipe.execute()
        assert not wait or replies[-1] >= 1, f"no replica acknowledged the writes to {stream}"
    return [m.key for msgs in by_stream.values() for m in msgs]


def node_index(svc, port: int) -> int:
    return svc.node_ports.index(port)


def kill_primary_and_promote(svc, client, stream: str, after_kill=lambda: None) -> tuple[int, int]:
    """SIGKILL the primary of `stream`'s slot, CLUSTER FAILOVER TAKEOVER on its replica, and wait until
    every live node names the replica as the slot's primary. (killed port, promoted port)."""
    port = primary_of(client, stream)
    slot = client.keyslot(stream)
    me = _connect(port)
    my_id = me.execute_command("CLUSTER MYID")
    replica = next(n for n in known_nodes(me) if n["primary"] == my_id)
    os.kill(svc.nodes[node_index(svc, port)].pid(), signal.SIGKILL)
    after_kill()
    promoted = _connect(replica["port"])
    promoted.execute_command("CLUSTER FAILOVER", "TAKEOVER")
    live = [p for p in svc.node_ports if p != port]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        owners = {owner(_connect(p), slot) for p in live}
        if owners == {replica["port"]}:
            return port, replica["port"]
        time.sleep(0.2)
    raise AssertionError(f"slot {slot} did not move to the replica on {replica['port']}: {owners}")


def owner(node, slot: int) -> int | None:
    for n in known_nodes(node):
        if "master" in n["flags"] and "fail" not in n["flags"]:
            for rng in n["slots"]:
                if int(rng[0]) <= slot <= int(rng[-1]):
                    return n["port"]
    return None


def test_four_partitions_drain_once_across_primaries_through_two_failovers(tmp_path, cfg, spark, valkey_cluster,
                                                                          spark_connect_server):
    """A primary SIGKILLed while a drain holds its claims (between claim and commit), then another one
    between the commit and the acknowledgement; each time its replica is promoted and the drains go on.
    Every message a replica acknowledged (WAIT) is in the table once."""
    path, c, p = cluster_pipeline(tmp_path)
    client = valkey_client(c, p)
    primaries = {primary_of(client, s) for s in p.source.streams}
    assert len(primaries) == 3, f"the test's streams should spread over the three primaries: {primaries}"
    ids = produce_acknowledged(client, p, 2000, seed=3)

    # 1. Killed between claim and commit.
    release = tmp_path / "release-claim"
    run = cli_drain(path, p.name, held_at("after_claim", release), remote=True)
    wait_held(run, lambda: pending(client, p) == 2000, 240, "the held run did not claim its batch")
    victim = p.source.streams[0]
    killed, promoted = kill_primary_and_promote(valkey_cluster, client, victim)
    assert primary_of(valkey_client(c, p), victim) == promoted
    release.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    s = summary_of(out)
    # The claims on the promoted replica are the replicated ones: XACK reached it through MOVED.
    assert s["outcome"] == "committed" and s["written"] == 2000 and s["acked"] == 2000, s
    valkey_cluster.up()  # the killed node comes back as a replica of the promoted one
    assert owner(_connect(killed), client.keyslot(victim)) == promoted

    # 2. Killed between commit and acknowledgement, another partition's primary.
    more = produce_acknowledged(client, p, 2000, seed=3, start=2000)
    release = tmp_path / "release-commit"
    run = cli_drain(path, p.name, held_at("after_commit", release), remote=True)
    log = c.target_path(p) / "_delta_log" / f"{1:020d}.json"  # the second batch's commit
    wait_held(run, log.exists, 240, "the held run did not commit its batch")
    victim = next(s for s in p.source.streams if primary_of(client, s) not in (killed, promoted))
    killed, promoted = kill_primary_and_promote(valkey_cluster, client, victim)
    release.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    s = summary_of(out)
    assert s["outcome"] == "committed" and s["written"] == 2000 and s["acked"] == 2000, s
    summaries = drain_until_done(c, p, spark, client)
    assert all(x.written == 0 for x in summaries)
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).batch == 2
    assert_exactly_once(spark, c, p, client, ids + more, 0)
    valkey_cluster.up()


def migrate(source_port: int, target_port: int, slot: int, password: str) -> tuple:
    """The first half of a slot migration: IMPORTING on the target, MIGRATING on the source, every key
    of the slot MIGRATEd. Returns the clients and ids for `finish_migration`."""
    src, dst = _connect(source_port), _connect(target_port)
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 10_000, "AUTH", password, "KEYS", *keys)
    return src, dst, dst_id


def test_a_slot_migrated_while_drains_hold_claims_loses_and_doubles_nothing(tmp_path, cfg, spark, valkey_cluster,
                                                                            spark_connect_server):
    """A stream's slot moved to another primary: its keys MIGRATEd while a drain holds committed claims
    (its XACK follows ASK to the new node), a drain claims while the slot is still migrating (ASK), and
    the drains after the move follow MOVED."""
    from deltadrain.config.embedded import valkey_cluster_password

    path, c, p = cluster_pipeline(tmp_path)
    client = valkey_client(c, p)
    ids = produce_acknowledged(client, p, 2000, seed=5)
    stream = p.source.streams[1]
    slot, source = client.keyslot(stream), primary_of(client, stream)
    target = next(port for port in {primary_of(client, s) for s in p.source.streams} if port != source)

    release = tmp_path / "release"
    run = cli_drain(path, p.name, held_at("after_commit", release), remote=True)
    log = c.target_path(p) / "_delta_log" / f"{0:020d}.json"
    wait_held(run, log.exists, 240, "the held run did not commit its batch")
    src, dst, dst_id = migrate(source, target, slot, valkey_cluster_password())
    # The stream is on the target now, the slot not yet handed over: the source answers ASK.
    assert stream in dst.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    assert not src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    release.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    s = summary_of(out)
    assert s["outcome"] == "committed" and s["acked"] == 2000, s

    more = produce_acknowledged(client, p, 1000, seed=5, start=2000, importing={stream: target})
    during = drain(c, p, spark=spark)
    assert during.outcome == "committed" and during.written == 1000 and during.acked == 1000
    for node in (dst, src, *(_connect(port) for port in valkey_cluster.node_ports if port not in (source, target))):
        with contextlib.suppress(Exception):  # a replica may refuse; the primaries' word is what counts
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    assert owner(src, slot) == target
    last = produce_acknowledged(client, p, 500, seed=5, start=3000)
    after = drain_until_done(c, p, spark, client)
    assert sum(x.written for x in after) == 500
    assert primary_of(valkey_client(c, p), stream) == target
    assert dst.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000).count(stream) == 1
    assert_exactly_once(spark, c, p, client, ids + more + last, 0)



def test_appends_a_failover_lost_after_their_commit_are_noted_where_the_stream_ends_before_the_checkpoint(
        tmp_path, cfg, spark, valkey_cluster):
    """Appends the primaries acknowledged without WAIT while one's replica was stopped (SIGSTOP), so that
    it never got them: a drain commits them, that primary is SIGKILLed, the replica promoted. The lake
    keeps what it committed; the stream on the new primary ends before the checkpoint's position, and
    `status` names it. The drains go on."""
    from deltadrain.sources import LakeSide, source_of
    from deltadrain.sources.valkey.status import BEHIND

    path, c, p = cluster_pipeline(tmp_path)
    client = valkey_client(c, p)
    ids = produce_acknowledged(client, p, 400, seed=7)
    victim = p.source.streams[2]
    me = _connect(primary_of(client, victim))
    on_it = [st for st in p.source.streams if primary_of(client, st) == primary_of(client, victim)]
    replica = next(n for n in known_nodes(me) if n["primary"] == me.execute_command("CLUSTER MYID"))
    stopped = valkey_cluster.nodes[node_index(valkey_cluster, replica["port"])].pid()
    # Stopped, and cut off: what the primary appends from now on is not even in the replica's socket.
    os.kill(stopped, signal.SIGSTOP)
    try:
        assert me.execute_command("CLIENT KILL", "TYPE", "replica") == 1
        lost = produce_acknowledged(client, p, 400, seed=7, start=400, wait=False)
        s = drain(c, p, spark=spark)
        assert s.outcome == "committed" and s.written == 800 and s.acked == 800
        kill_primary_and_promote(valkey_cluster, client, victim, lambda: os.kill(stopped, signal.SIGCONT))
    finally:
        os.kill(stopped, signal.SIGCONT)
    lake = LakeSide(lambda: read_checkpoint(spark, str(c.target_path(p)), p.name))
    notes = source_of(p).counts(c, p, lake)["notes"]
    # Every stream of the killed primary lost its last appends; the other primaries' streams none.
    assert {n["state"] for n in notes} == {BEHIND} and len(notes) == len(on_it)
    assert all(any(f"stream {st} ends at" in n["note"] for n in notes) for st in on_it)
    valkey_cluster.up()  # the killed node back, as the promoted one's replica: WAIT has a replica again
    later = produce_acknowledged(client, p, 400, seed=7, start=800)
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, ids + lost + later, 0)
