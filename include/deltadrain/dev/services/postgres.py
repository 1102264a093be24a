"""The embedded PostgreSQL (`services up --only postgres`): Debian's server binaries, a data directory
under the services' home, `wal_level=logical` and a publication of every table for change data capture
(docs/cdc-services.md).

PostgreSQL refuses to run as root. As root, it runs in a user namespace of its own in which our uid
is an ordinary account's (the `postgres` account's, else `nobody`'s): it has no capabilities, and on
this machine its files are ours, as every other service's are, with no chown and no other account that
needs a way into the home (a test's home is a private temporary directory).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    POSTGRES_DB,
    POSTGRES_PUBLICATION,
    POSTGRES_USER,
    ports,
    postgres_conninfo,
    postgres_home,
    postgres_login,
    postgres_login_file,
)
from deltadrain.dev.services.process import Service, port_open
from deltadrain.errors import PrerequisiteError, ServiceError

# Where Debian's packages put each major version's server binaries.
DEBIAN_PREFIX = Path("/usr/lib/postgresql")
FIX = "run scripts/ensure-postgres (Debian: apt-get install -y postgresql)"
# Debezium's connector takes one slot and one WAL sender; room for a few more (a second connector, pg_recvlogical).
REPLICATION_SLOTS = 10


def _major(version_dir: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version_dir.name)) or (0,)


def postgres_bindir() -> Path:
    """The newest PostgreSQL server's bin/ (Debian's /usr/lib/postgresql/<major>/bin), else the directory of
    a `postgres` on PATH; a missing one names the fix."""
    found = sorted((p.parent for p in DEBIAN_PREFIX.glob("*/bin/postgres")), key=lambda b: _major(b.parent))
    if found:
        return found[-1]
    on_path = shutil.which("postgres")
    if on_path and shutil.which("initdb", path=str(Path(on_path).parent)):
        return Path(on_path).parent
    raise PrerequisiteError(f"no PostgreSQL server binaries (postgres, initdb) in {DEBIAN_PREFIX}/*/bin or on PATH; {FIX}")


def namespace_account() -> pwd.struct_passwd:
    """The account root's processes appear as inside their user namespace: PostgreSQL's own when the package
    made one, else `nobody`. initdb looks its name up, so it must be a real account."""
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PrerequisiteError("neither a `postgres` nor a `nobody` account exists to run PostgreSQL as; " + FIX)


def unprivileged(command: list[str], *, euid: int | None = None, account: pwd.struct_passwd | None = None) -> list[str]:
    """`command` as PostgreSQL will run it: as is for an ordinary user; for root, in a new user namespace
    in which our uid and gid map to an ordinary account's (unshare execs the command: its pid is the server's)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return command
    unshare = shutil.which("unshare")
    if unshare is None:
        raise PrerequisiteError("PostgreSQL refuses to run as root, and `unshare` (util-linux), which runs it as "
                                "an ordinary user here, is not on PATH; run deltadrain as another user, or install util-linux")
    account = account or namespace_account()
    return [unshare, "--user", f"--map-user={account.pw_uid}", f"--map-group={account.pw_gid}", *command]


def server_command(bindir: Path, data: Path, port: int) -> list[str]:
    """The postmaster on 127.0.0.1 only (no Unix socket: no directory of the machine's to write to), with
    the logical WAL and the replication slots and WAL senders Debezium's connector needs. Settings, not
    secrets, on the command line: the port changes between starts."""
    settings = {"listen_addresses": "127.0.0.1", "port": str(port), "unix_socket_directories": "",
                "wal_level": "logical", "max_replication_slots": str(REPLICATION_SLOTS),
                "max_wal_senders": str(REPLICATION_SLOTS)}
    return [str(bindir / "postgres"), "-D", str(data), *[a for k, v in settings.items() for a in ("-c", f"{k}={v}")]]


def init_data_dir(bindir: Path, data: Path, admin_password: str) -> None:
    """initdb, once: the superuser `postgres` with the login file's password (given on initdb's standard
    input, never on a command line), SCRAM for every connection. Made beside `data` and renamed into
    place, so that a failed initdb leaves nothing that looks like a cluster."""
    if (data / "PG_VERSION").exists():
        return
    staging = data.with_name(data.name + ".init")
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run(unprivileged([str(bindir / "initdb"), "-D", str(staging), "-U", "postgres",
                                        "--pwfile=/dev/stdin", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C",
                                        "--no-instructions"]),
                          input=admin_password + "\n", capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise ServiceError(f"initdb of the embedded PostgreSQL in {staging} failed (exit {done.returncode}):\n"
                           f"{(done.stdout + done.stderr).strip()[-1500:]}")
    os.replace(staging, data)


def ensure_cdc_database(cfg: DeltadrainConfig) -> None:
    """As the superuser: the deltadrain role (LOGIN, REPLICATION), its database, and in it a publication of
    every table, so that a table made later is captured without the connector's role owning or listing it.
    Each is made only when missing."""
    import psycopg
    from psycopg import sql

    login = postgres_login()
    with psycopg.connect(**postgres_conninfo(cfg, admin=True, dbname="postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [POSTGRES_USER]).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(POSTGRES_USER), sql.Literal(login["password"])))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [POSTGRES_DB]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(POSTGRES_DB),
                                                                      sql.Identifier(POSTGRES_USER)))
    with psycopg.connect(**postgres_conninfo(cfg, admin=True), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [POSTGRES_PUBLICATION]).fetchone() is None:
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(POSTGRES_PUBLICATION)))


def postgres_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).postgres
    home = postgres_home()
    data = home / "data"

    def prepare() -> None:
        init_data_dir(postgres_bindir(), data, postgres_login()["admin_password"])

    def healthy() -> bool:
        import psycopg

        if not port_open(port):
            return False
        try:
            ensure_cdc_database(cfg)
            with psycopg.connect(**postgres_conninfo(cfg)) as conn:
                return conn.execute("SHOW wal_level").fetchone() == ("logical",)
        except psycopg.OperationalError:  # starting up, or a login it refuses: its log says which
            return False

    # SIGINT is the fast shutdown: open sessions (the connector's) are ended, not waited for. The server's
    # children are sessions of their own and end with it.
    return Service("postgres", home, [port], lambda: unprivileged(server_command(postgres_bindir(), data, port)),
                   healthy, prepare=prepare, start_timeout=60, stop_signal=signal.SIGINT,
                   describe=lambda: f"postgresql://127.0.0.1:{port}/{POSTGRES_DB} (user {POSTGRES_USER}, "
                                    f"login in {postgres_login_file()})")
