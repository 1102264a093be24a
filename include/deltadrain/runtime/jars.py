"""The JVM artefacts: fetched once from Maven Central with `mvn` into a git-ignored cache, plus
deltadrain's own Delta log stores, built with `mvn package`: jvm/logstore (local lakes) into the spark
kind, jvm/s3logstore (lakes on S3) into the s3a kind.

The kinds: spark (Delta, the Kafka source), kafka (the embedded broker), debezium (Kafka Connect's
worker with Debezium's Postgres connector: the embedded change-data-capture service), s3 (the embedded
S3 server, S3Proxy), registry (the embedded schema registry, Apicurio Registry built from jvm/registry as a Quarkus
app: `quarkus-app/`, run with `java -jar`) and s3a (hadoop-aws and the AWS SDK bundle: added to a Spark session only when its lake is
on S3, so the local sessions and their class-data archive stay as they are).

Spark sessions, spark-submit and the Kafka broker only ever read this cache; nothing is resolved
at job run time (no --packages, no Ivy), so a job never depends on a registry being reachable.

A kind's finished cache is also kept in a per-user store (`paths.jar_store`), under the hash of
everything that made it (its pom, the sources of the modules built into it, the jars pyspark ships, the
JDK): a fresh clone of the same tree hard-links it from there instead of running Maven again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from deltadrain.errors import PrerequisiteError
from deltadrain.paths import jar_cache, jar_store, jvm_dir
from deltadrain.runtime.java import java_home

KINDS = ("spark", "kafka", "debezium", "s3", "s3a", "registry")
FIX = "make jars"
# Built from jvm/logstore (not fetched) into the spark kind: the log store every session commits with.
LOG_STORE_ARTIFACT = "deltadrain-logstore"
LOG_STORE_CLASS = "dev.deltadrain.storage.LocalLinkLogStore"
# Built from jvm/s3logstore into the s3a kind: the log store of lakes on S3 (conditional PUT).
S3_LOG_STORE_ARTIFACT = "deltadrain-s3logstore"
# Built from jvm/connect into the spark kind: the embedded Spark Connect server's entry point.
CONNECT_ARTIFACT = "deltadrain-connect"
CONNECT_SERVER_CLASS = "dev.deltadrain.connect.ConnectServer"
# The jar kinds whose cache also gets modules of jvm/ built with `mvn package`: (module, artifact) each.
_BUILT = {"spark": (("logstore", LOG_STORE_ARTIFACT), ("connect", CONNECT_ARTIFACT)),
          "s3a": (("s3logstore", S3_LOG_STORE_ARTIFACT),)}
_REQUIRED = {kind: tuple(artifact for _, artifact in modules) for kind, modules in _BUILT.items()}
# The kinds whose jars join pyspark's on one class path: those Spark already ships are dropped.
_ON_SPARK = ("spark", "s3a")
_MARKER = ".complete"
# The registry kind is an app, not jars for a class path: its fast-jar directory and the jar that starts it.
REGISTRY_APP = "quarkus-app"
REGISTRY_RUN_JAR = f"{REGISTRY_APP}/quarkus-run.jar"
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d+[\w.\-]*)\.jar$")


def artifact_name(jar_file: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`; used to drop jars Spark already ships."""
    match = _JAR_NAME.match(jar_file)
    return match.group("artifact") if match else jar_file.removesuffix(".jar")


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jars_to_keep(fetched: list[str], provided: set[str]) -> list[str]:
    """Keep the fetched jars whose artefact Spark does not already put on its classpath.

    Delta and the Kafka source drag in their own copies of Jackson, Hadoop, Scala and Parquet;
    two versions of one library on a classpath is how NoSuchMethodError happens at run time.
    """
    return sorted(j for j in fetched if artifact_name(j) not in provided)


# By full coordinates: `dependency:` alone takes the version Maven's super-POM names (2.8 with
# Maven 3.8), so a different Maven would fetch the jars with a different plugin.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.11.0"


def _mvn(args: list[str], *, quiet: bool) -> None:
    cmd = ["mvn", "-B", *(["-q"] if quiet else []), *args]
    done = subprocess.run(cmd, capture_output=quiet, text=True)
    if done.returncode != 0:
        # Maven says why on stdout (build errors) or stderr (the wrapper: JAVA_HOME, no JDK).
        tail = ((done.stdout or "")[-2000:] + (done.stderr or "")[-1000:]) if quiet else ""
        raise PrerequisiteError(f"`{' '.join(cmd)}` failed (exit {done.returncode}).\n{tail}")


def build_module(out_dir: Path, *, quiet: bool = True, module: str = "logstore",
                 artifact: str = LOG_STORE_ARTIFACT) -> Path:
    """Compile jvm/<module> (mvn package, its build kept outside the source tree) into `out_dir`."""
    with tempfile.TemporaryDirectory(dir=out_dir) as build:
        _mvn(["-f", str(jvm_dir() / module / "pom.xml"), "package", f"-Ddeltadrain.build.dir={build}"],
             quiet=quiet)
        (jar,) = Path(build).glob(f"{artifact}-*.jar")
        return Path(shutil.move(str(jar), out_dir / jar.name))


def _inputs(kind: str) -> list[Path]:
    """The files a kind's cache is made from: its jvm/ folder and those of the modules built into it."""
    folders = [jvm_dir() / kind, *(jvm_dir() / module for module, _ in _BUILT.get(kind, ()))]
    return sorted(f for folder in folders for f in folder.rglob("*")
                  if f.is_file() and "target" not in f.relative_to(folder).parts)


def store_key(kind: str) -> str:
    """The hash of everything a kind's cache depends on: its inputs' paths and contents, the jars pyspark
    already ships (those are left out of the spark and s3a kinds), and the JDK that compiles the modules."""
    digest = hashlib.sha256(f"{kind}\0".encode())
    for f in _inputs(kind):
        digest.update(f"{f.relative_to(jvm_dir())}\0".encode() + f.read_bytes() + b"\0")
    if kind in _ON_SPARK:
        digest.update(" ".join(sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))).encode())
    home = java_home()
    release = home / "release" if home is not None else None
    digest.update(release.read_bytes() if release is not None and release.exists() else b"no JDK release file")
    return digest.hexdigest()[:24]


def _link_tree(source: Path, target: Path) -> None:
    """`source` copied to `target` as hard links (a copy where the two are on different file systems)."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link, symlinks=True)


def _store_entry(kind: str) -> Path | None:
    """Where the store keeps (or would keep) this kind's cache for its current inputs; None without a store."""
    store = jar_store()
    return store / f"{kind}-{store_key(kind)}" if store is not None else None


def _from_store(entry: Path, target: Path) -> bool:
    """Fill `target` from the store's `entry`, if that is a finished one."""
    marker = entry / _MARKER
    if not marker.exists() or not all((entry / name).exists() for name in marker.read_text().split()):
        return False  # none yet, or one someone pruned: built again, and kept again by `_to_store`
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        _link_tree(entry, Path(staging) / target.name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(Path(staging) / target.name, target)
    return True


def _to_store(entry: Path, target: Path) -> None:
    """Keep a finished cache in the store. A store that cannot be written only costs the next clone a build."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=entry.parent) as staging:
            _link_tree(target, Path(staging) / target.name)
            if entry.exists():
                shutil.rmtree(entry)  # an incomplete one (`_from_store` passed it over)
            os.replace(Path(staging) / target.name, entry)
    except OSError as exc:
        print(f"deltadrain jars: could not keep the {target.name} jars in {entry.parent} ({exc}); the next clone "
              "builds them again", file=sys.stderr)


def fetch(kind: str, *, quiet: bool = True) -> Path:
    """Fill the cache for `kind` from its pom (jvm/<kind>/pom.xml), plus what `_BUILT` builds for it:
    for spark the log store (jvm/logstore) and the Connect server's entry point (jvm/connect), for s3a
    the S3 log store (jvm/s3logstore); or link it from the per-user store when the same inputs made one
    before. Idempotent."""
    if kind not in KINDS:
        raise ValueError(f"unknown jar kind {kind!r}; expected one of {KINDS}")
    target = jar_cache() / kind
    target.parent.mkdir(parents=True, exist_ok=True)
    entry = _store_entry(kind)
    if entry is not None and _from_store(entry, target):
        return target
    built = _build(kind, target, quiet=quiet)
    if entry is not None:
        _to_store(entry, built)
    return built


def _build(kind: str, target: Path, *, quiet: bool) -> Path:
    """The kind's cache made with Maven into `target`, replacing what was there only once it succeeded."""
    if shutil.which("mvn") is None:
        raise PrerequisiteError(
            "Maven (mvn) is not on PATH; it fetches the Delta, Spark-Kafka, Kafka broker, S3 server and "
            "hadoop-aws jars and builds deltadrain's Delta log stores. "
            "Install it (Debian: `apt-get install -y maven`), then run `make jars`."
        )
    pom = jvm_dir() / kind / "pom.xml"
    if kind == "registry":
        return build_registry(target, pom, quiet=quiet)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        _mvn(["-f", str(pom), f"{DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
              f"-DoutputDirectory={staging}"], quiet=quiet)
        for module, artifact in _BUILT.get(kind, ()):
            build_module(Path(staging), quiet=quiet, module=module, artifact=artifact)
        fetched = [p.name for p in Path(staging).glob("*.jar")]
        provided = {artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar")} if kind in _ON_SPARK else set()
        keep = jars_to_keep(fetched, provided)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        for name in keep:
            shutil.move(str(Path(staging) / name), target / name)
        (target / _MARKER).write_text("\n".join(keep) + "\n")
    return target


def build_registry(target: Path, pom: Path, *, quiet: bool = True) -> Path:
    """`mvn package` of jvm/registry (the Quarkus build resolves and packs the app), its quarkus-app/
    moved into `target`, replacing what was there only once the build succeeded."""
    with tempfile.TemporaryDirectory(dir=target.parent) as build:
        _mvn(["-f", str(pom), "package", f"-Ddeltadrain.build.dir={build}"], quiet=quiet)
        app = Path(build) / REGISTRY_APP
        if not (app / "quarkus-run.jar").exists():
            raise PrerequisiteError(f"`mvn package` on {pom} made no {REGISTRY_RUN_JAR}; run `{FIX}` again.")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        shutil.move(str(app), target / REGISTRY_APP)
        (target / _MARKER).write_text(REGISTRY_RUN_JAR + "\n")
    return target


def classpath(kind: str) -> list[Path]:
    """The cached jars for `kind`, or one clear error naming the command that fills the cache."""
    target = jar_cache() / kind
    marker = target / _MARKER
    if not marker.exists():
        raise PrerequisiteError(
            f"The {kind} jars are not in the cache ({target}). Run `{FIX}` to fetch them from "
            "Maven Central with mvn (Java 17 and Maven needed)."
        )
    jars = [target / name for name in marker.read_text().split()]
    missing = [j.name for j in jars if not j.exists()]
    missing += [f"{a}-*.jar" for a in _REQUIRED.get(kind, ()) if not any(artifact_name(j.name) == a for j in jars)]
    if missing:
        raise PrerequisiteError(f"The {kind} jar cache ({target}) lacks {missing[:3]}; run `{FIX}` again.")
    return jars
