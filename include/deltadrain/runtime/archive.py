"""The driver JVM's class-data archive: the classes a drain loads, parsed and verified once.

Every drain task starts a JVM that loads some 25 000 classes (Spark, Delta, Parquet, Arrow) before
its first commit. HotSpot can map them from an archive instead (AppCDS, `-XX:SharedArchiveFile`).
`make install` builds one by running a small real drain (a private Valkey, a throwaway lake) with
`-XX:ArchiveClassesAtExit` (`deltadrain.dev.archive_training`); a one-message drain process then ends about 4 s sooner
(bench/jit_flags/README.md, "One-message drains and the class-data archive").

An archive belongs to one JDK and one set of jars. Its file name is their fingerprint, so after a
JDK or jar change a session finds no archive and starts as before, until the next `make install`.
The JVM checks the archive itself too and, if it does not match, starts without it (-Xshare:auto).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from deltadrain.paths import jar_cache
from deltadrain.runtime.java import java_home

# The JVM's own warnings (an archive it cannot use, for one) go to stderr: stdout carries a run's
# JSON summary.
JVM_LOGGING = "-Xlog:disable -Xlog:all=warning:stderr"


def archive_dir() -> Path:
    return jar_cache() / "cds"


def _stat(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def fingerprint(jdk: list[tuple[str, int, int]], jars: list[tuple[str, int, int]]) -> str:
    """What an archive depends on: the JDK's files and every jar on the driver's class path, by
    name, size and modification time (the same things HotSpot checks before it maps one)."""
    digest = hashlib.sha256()
    for name, size, mtime in [*sorted(jdk), *sorted(jars)]:
        digest.update(f"{name}\0{size}\0{mtime}\n".encode())
    return digest.hexdigest()[:20]


def archive_path() -> Path | None:
    """Where the archive for this JDK and this jar set is (or would be); None without a JDK."""
    from deltadrain.runtime.jars import classpath, pyspark_jars_dir

    home = java_home()
    if home is None:
        return None
    jdk = [_stat(p) for p in (home / "release", home / "lib" / "server" / "libjvm.so",
                              home / "lib" / "modules") if p.exists()]
    jars = [_stat(p) for p in [*pyspark_jars_dir().glob("*.jar"), *classpath("spark")]]
    return archive_dir() / f"drain-{fingerprint(jdk, jars)}.jsa"


def java_options() -> str:
    """The driver's extra JVM options: the archive's when one was built for this JDK and these jars."""
    path = archive_path()
    if path is not None and path.exists():
        return f"{JVM_LOGGING} -XX:SharedArchiveFile={path}"
    return JVM_LOGGING
