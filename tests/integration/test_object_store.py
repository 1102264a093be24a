"""A lake on S3, against the embedded S3 server (S3Proxy, real HTTP, real signatures): the service
itself, its conditional PUT, Spark with Delta through hadoop-aws, delta-rs and pyarrow on the same
store, and two Spark drivers racing for the same version of one table."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deltadrain.config.embedded import S3_BUCKET, s3_login_file
from deltadrain.dev.s3http import request
from deltadrain.lake.objectstore import (
    embedded_connection,
    pyarrow_filesystem,
    resolve,
    storage_options,
)
from tests.support.processes import SPAWNED
from tests.support.services import cli, own_env, processes_under

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).parent / "s3_driver.py"


@pytest.fixture(scope="module")
def store(s3_server):
    return resolve({}, lookup=lambda conn_id: None, embedded=embedded_connection)


def test_services_up_only_s3_asks_for_a_login_kept_owner_only(tmp_path):
    env = own_env(tmp_path)
    home = Path(env["DELTADRAIN_HOME"])
    up = cli(env, "services", "up", "--only", "s3")
    assert up.returncode == 0, up.stderr
    assert "result=started" in up.stdout and f"127.0.0.1:{env['DELTADRAIN_S3_PORT']}" in up.stdout
    s3 = home / "services" / "s3"
    for secret in (s3 / "login.json", s3 / "s3proxy.conf"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert (s3 / "s3.log").exists() and (s3 / "s3.pid").exists()
    login = json.loads((s3 / "login.json").read_text())
    assert login["secret_access_key"] not in up.stdout + up.stderr
    # A bare status leaves it out (the config's lake is local); --only names it.
    assert "service=s3" not in cli(env, "services", "status").stdout
    assert cli(env, "services", "status", "--only", "s3").returncode == 0
    assert cli(env, "services", "up", "--only", "s3").stdout.count("result=already running") == 1
    down = cli(env, "services", "down")
    assert down.returncode == 0 and "service=s3  result=stopped" in down.stdout, down.stdout
    assert processes_under(home) == []
    assert cli(env, "services", "status", "--only", "s3").returncode == 3


def test_the_server_refuses_a_wrong_login_and_airflow_gets_the_right_one(store, cfg, monkeypatch):
    assert request(store, "GET").status == 200
    assert request(dataclasses.replace(store, secret_access_key="wrong"), "GET").status == 403
    assert request(dataclasses.replace(store, access_key_id="nobody"), "GET").status == 403
    from deltadrain.config.embedded import airflow_env

    monkeypatch.delenv("AIRFLOW_CONN_DELTADRAIN_S3", raising=False)
    conn = json.loads(airflow_env(cfg)["AIRFLOW_CONN_DELTADRAIN_S3"])
    assert conn["conn_type"] == "aws" and conn["extra"]["endpoint_url"] == store.endpoint_url
    assert resolve({"AIRFLOW_CONN_DELTADRAIN_S3": json.dumps(conn)}, lookup=lambda c: None) == \
        dataclasses.replace(store, source="AIRFLOW_CONN_DELTADRAIN_S3")
    assert stat.S_IMODE(s3_login_file().stat().st_mode) == 0o600


def test_a_put_if_absent_lets_exactly_one_writer_of_a_key_win(store):
    key = f"conditional/{time.time_ns()}"
    first = request(store, "PUT", S3_BUCKET, key, b"first", {"If-None-Match": "*"})
    second = request(store, "PUT", S3_BUCKET, key, b"second", {"If-None-Match": "*"})
    assert (first.status, second.status) == (200, 412), second.body[:300]
    assert request(store, "GET", S3_BUCKET, key).body == b"first"
    # Without the condition the second PUT replaces the first: the test tells the two apart.
    assert request(store, "PUT", S3_BUCKET, key, b"third").status == 200
    assert request(store, "GET", S3_BUCKET, key).body == b"third"
    # Racing writers, round after round: one 200 per key, the others 412, the winner's bytes kept.
    rounds, writers = 60, 4
    results: dict[int, list[tuple[int, int]]] = {r: [] for r in range(rounds)}

    def write(w: int, go: threading.Barrier) -> None:
        for r in range(rounds):
            go.wait()
            status = request(store, "PUT", S3_BUCKET, f"{key}-race/{r}", f"w{w}".encode(),
                             {"If-None-Match": "*"}).status
            results[r].append((status, w))

    go = threading.Barrier(writers)
    threads = [threading.Thread(target=write, args=(w, go)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, answers in results.items():
        assert sorted(s for s, _ in answers) == [200] + [412] * (writers - 1), (r, answers)
        (winner,) = [w for s, w in answers if s == 200]
        assert request(store, "GET", S3_BUCKET, f"{key}-race/{r}").body == f"w{winner}".encode()


def driver(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'include'}"})
    SPAWNED.append(proc)
    return proc


def result(proc: subprocess.Popen, timeout: int = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    # py4j logs its own lines to stdout when the session stops: the result is the JSON line.
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def fs_selector(prefix: str):
    from pyarrow.fs import FileSelector

    return FileSelector(prefix, recursive=False)


@pytest.mark.slow
def test_spark_on_s3_creates_and_merges_and_two_drivers_racing_for_a_version_lose_no_commit(store, tmp_path):
    """One Spark driver creates a Delta table on the S3 server and MERGEs into it; then it and a
    second driver (another process) append at once, racing for each version. delta-rs and pyarrow
    read the result with the same login: every commit there, one writer's per version."""
    from deltalake import DeltaTable

    path = f"s3a://{S3_BUCKET}/lake/{time.time_ns()}/orders"
    # 50 rounds of the log-store race: Delta's own store lets both drivers win three in four of them
    # (docs/object-store.md), so a store that lets a version be won twice has fifty chances to show it.
    appends, rows, rounds = 2, 10, 50
    go = tmp_path / "go"
    procs = [driver(path, str(w), str(appends), str(tmp_path / f"ready-{w}"), str(go), str(rounds)) for w in (0, 1)]
    for step in ("", "2"):  # the appends, then the log store race
        ready = [tmp_path / f"ready-{w}{step}" for w in (0, 1)]
        deadline = time.monotonic() + 400
        while not all(r.exists() for r in ready):
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-3000:] for p in procs if p.poll() is not None]
            assert time.monotonic() < deadline, "the drivers did not get ready"
            time.sleep(0.02)
        (tmp_path / f"go{step}").touch()
    first, second = (result(p) for p in procs)
    print("drivers' timings (s):", {k: v for k, v in first.items() if k.endswith("_s")},
          {k: v for k, v in second.items() if k.endswith("_s")})
    merged = [[0, "first"], [1, "first"], [2, "first"], *[[i, "merged"] for i in range(3, 8)]]
    assert first["store"] == "dev.deltadrain.storage.S3ConditionalLogStore"
    assert first["rows"] == merged
    # Another writer's version 0 is refused the way Delta expects; our own bytes again are no error.
    assert first["other_writer"].startswith("java.nio.file.FileAlreadyExistsException"), first["other_writer"]

    table = DeltaTable(path, storage_options=storage_options(store))
    assert table.version() == 1 + 2 * appends
    appended = [[i, f"w{(i - 100) // (appends * rows)}"] for i in range(100, 100 + 2 * appends * rows)]
    got = sorted([r["id"], r["v"]] for r in table.to_pyarrow_table().to_pylist())
    assert got == merged + appended, "a commit was lost"

    # pyarrow sees the same objects: one commit file per version, the data files delta-rs names.
    fs = pyarrow_filesystem(store)
    prefix = path.removeprefix("s3a://")
    log = sorted(f.base_name for f in fs.get_file_info(fs_selector(prefix + "/_delta_log")) if f.is_file)
    assert [n for n in log if n.endswith(".json")] == [f"{v:020d}.json" for v in range(2 + 2 * appends)]
    data = {f.base_name for f in fs.get_file_info(fs_selector(prefix)) if f.base_name.endswith(".parquet")}
    assert {uri.rsplit("/", 1)[1] for uri in table.file_uris()} <= data
    # A commit whose transaction read an older version than the one before it lost the race for that
    # version and committed again after it: the race happened, and the loser's commit is still there.
    read_versions = {}
    for v in range(2, 2 + 2 * appends):
        with fs.open_input_stream(f"{prefix}/_delta_log/{v:020d}.json") as f:
            actions = [json.loads(line) for line in f.read().decode().splitlines()]
        read_versions[v] = next(a["commitInfo"] for a in actions if "commitInfo" in a).get("readVersion")
    assert [v for v, read in read_versions.items() if read is not None and read < v - 1], \
        f"no commit lost a race (readVersion per version: {read_versions})"

    # The log store itself, driver against driver: each version won once, and holds its winner's line.
    # (Delta's own S3SingleDriverLogStore, S3_DRIVER_LOG_STORE in s3_driver.py, lets both win some.)
    race = first["log_store_race"], second["log_store_race"]
    won = {w: set(r["won"]) for w, r in enumerate(race)}
    print(f"log store race: versions won {len(won[0])} + {len(won[1])}, "
          f"refused by the conditional PUT {race[0]['refused_puts']} + {race[1]['refused_puts']}")
    assert won[0] & won[1] == set(), f"versions both drivers won: {sorted(won[0] & won[1])}"
    assert won[0] | won[1] == set(range(rounds))
    # Every loss passed through the store's conditional PUT, which the server refused (412).
    assert race[0]["refused_puts"] + race[1]["refused_puts"] == rounds
    assert won[0] and won[1], "one driver won every version: the two never raced"
    for w, versions in won.items():
        for v in sorted(versions)[:20]:
            with fs.open_input_stream(f"{prefix}-log/_delta_log/{v:020d}.json") as f:
                assert json.loads(f.read()) == {"writer": w}
