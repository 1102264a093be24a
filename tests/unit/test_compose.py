"""docker-compose.yaml, checked without Docker.

No Docker engine runs here, so the file has to be right by construction: every repository path it
mounts, copies into the image or names in a command exists; no secret is written into it; its images
match the pins of requirements.txt and the poms; and config/pipelines.compose.yaml is
config/pipelines.yaml with only the source addresses changed to the compose service names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
PROJECT = PurePosixPath("/opt/deltadrain")  # where the containers see the repository
HOST_JAR_CACHE = PurePosixPath(".cache/jars")  # git-ignored, made by `make jars`
SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN")
REQUIRED_SERVICES = ("valkey", "kafka", "s3", "spark-master", "spark-worker")

# Compose interpolation: ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}.
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")
# An absolute path that is not part of a URL (spark://host, http://host/path) or of a $VAR/path.
ABS_PATH = re.compile(r"(?<![\w$.:/-])/[\w.-]+(?:/[\w.-]+)*")


@dataclass(frozen=True)
class Mount:
    kind: str  # bind | volume | tmpfs
    source: str | None
    target: PurePosixPath
    read_only: bool


@cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def resolve(value: object) -> str:
    """A value as compose would see it with no variables set: defaults taken, `$$` unescaped."""
    def sub(m: re.Match) -> str:
        op, arg = m.group("op") or "", m.group("arg") or ""
        return arg if op.endswith("-") else f"<{m.group('name')}>" if op.endswith("?") else ""

    return INTERPOLATION.sub(sub, str(value).replace("$$", "\0")).replace("\0", "$")


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def mounts(service: dict) -> list[Mount]:
    found = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            if len(parts) == 1:  # anonymous volume
                found.append(Mount("volume", None, PurePosixPath(parts[0]), False))
                continue
            source, target, mode = parts[0], parts[1], (parts[2] if len(parts) > 2 else "")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            found.append(Mount(kind, source, PurePosixPath(target), "ro" in mode.split(",")))
        else:
            found.append(Mount(entry.get("type", "volume"), entry.get("source"),
                               PurePosixPath(entry["target"]), bool(entry.get("read_only"))))
    return found


def repo_path(source: str) -> PurePosixPath:
    """A bind mount's source, relative to the repository root (the directory of the compose file)."""
    path = PurePosixPath(source)
    parts = [p for p in path.parts if p != "."]
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def is_host_jar_cache(rel: PurePosixPath) -> bool:
    return rel == HOST_JAR_CACHE or HOST_JAR_CACHE in rel.parents


def assert_repo_path(rel: PurePosixPath, what: str) -> None:
    if is_host_jar_cache(rel):
        # Not in git: `make jars` fills it from the poms. The poms and the target must be there.
        assert (ROOT / "jvm" / "spark" / "pom.xml").is_file(), f"{what}: jvm/spark/pom.xml is missing"
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(r"^jars:", makefile, re.M), f"{what}: the Makefile has no `jars` target"
        return
    assert ".." not in rel.parts, f"{what}: {rel} leaves the repository"
    assert (ROOT / rel).exists(), f"{what}: {rel} does not exist in the repository"


# --- the project image (build.dockerfile_inline) ---------------------------------------------------

def dockerfile(service: dict) -> str | None:
    build = service.get("build")
    return build.get("dockerfile_inline") if isinstance(build, dict) else None


def dockerfile_instructions(text: str) -> list[tuple[str, list[str]]]:
    logical = re.sub(r"\\\n", " ", text)
    result = []
    for line in logical.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.split()))
    return result


def image_copies(service: dict) -> dict[PurePosixPath, PurePosixPath]:
    """Container path -> repository path of every COPY/ADD of the service's inline Dockerfile."""
    text = dockerfile(service)
    if text is None:
        return {}
    context = repo_path(service["build"].get("context", "."))
    workdir, copies = PurePosixPath("/"), {}
    for word, args in dockerfile_instructions(text):
        if word == "WORKDIR":
            workdir = workdir / args[0]
        elif word in ("COPY", "ADD"):
            if any(a.startswith("--from") for a in args):
                continue
            *sources, dest = [a for a in args if not a.startswith("--")]
            for src in sources:
                rel = context / src.rstrip("/")
                # A directory's contents land in dest; a file lands in dest/ (or as dest, if alone).
                into_dir = (ROOT / rel).is_file() and (dest.endswith("/") or len(sources) > 1)
                copies[workdir / dest / rel.name if into_dir else workdir / dest] = rel
    return copies


def built_services() -> dict[str, dict]:
    return {name: svc for name, svc in services().items() if dockerfile(svc) is not None}


# --- container paths -> repository paths ------------------------------------------------------------

def locate(service: dict, path: PurePosixPath) -> tuple[str, PurePosixPath | None]:
    """Where a container path comes from: ("bind", repo path), ("volume", None), ("image", repo path)
    or ("unknown", None)."""
    best = None
    for m in mounts(service):
        covers = path == m.target or m.target in path.parents
        if covers and (best is None or len(m.target.parts) > len(best.target.parts)):
            best = m
    if best is not None:
        if best.kind == "bind":
            return "bind", repo_path(best.source) / path.relative_to(best.target)
        return best.kind, None
    for dest, rel in image_copies(service).items():
        if path == dest or dest in path.parents:
            return "image", rel / path.relative_to(dest)
    return "unknown", None


def command_strings(service: dict) -> list[str]:
    strings = []
    for key in ("command", "entrypoint"):
        value = service.get(key)
        strings += [value] if isinstance(value, str) else [str(v) for v in value or []]
    test = (service.get("healthcheck") or {}).get("test")
    strings += [test] if isinstance(test, str) else [str(v) for v in test or []]
    return strings


def referenced_paths(service: dict) -> set[PurePosixPath]:
    texts = command_strings(service) + list(environment(service).values())
    return {PurePosixPath(p) for text in texts for p in ABS_PATH.findall(resolve(text))}


# --- tests ---------------------------------------------------------------------------------------------

def test_compose_has_the_services():
    names = set(services())
    missing = [n for n in REQUIRED_SERVICES if n not in names]
    assert not missing, f"docker-compose.yaml lacks services {missing}"
    assert any("airflow" in n for n in names), "docker-compose.yaml has no Airflow service"


def bind_mounts() -> list[tuple[str, Mount]]:
    return [(name, m) for name, svc in services().items() for m in mounts(svc) if m.kind == "bind"]


@pytest.mark.parametrize(("name", "mount"), bind_mounts(),
                         ids=lambda x: x if isinstance(x, str) else x.source)
def test_bind_mount_sources_exist(name, mount):
    assert mount.source.startswith("."), f"{name}: bind mount {mount.source} is not relative to the repo"
    assert_repo_path(repo_path(mount.source), f"service {name}, mount {mount.source}:{mount.target}")


def test_named_volumes_are_declared():
    declared = set(compose().get("volumes") or {})
    for name, svc in services().items():
        for m in mounts(svc):
            if m.kind == "volume" and m.source:
                assert m.source in declared, f"{name}: volume {m.source} is not declared under volumes:"


def test_paths_in_commands_and_environment_exist():
    checked = set()
    for name, svc in services().items():
        bind_targets = [m.target for m in mounts(svc) if m.kind == "bind"]
        for path in sorted(referenced_paths(svc)):
            ours = path == PROJECT or PROJECT in path.parents
            if not ours and not any(path == t or t in path.parents for t in bind_targets):
                continue  # the image's own files (/opt/spark/bin/..., /tmp/...)
            kind, rel = locate(svc, path)
            assert kind != "unknown", f"{name}: {path} is neither mounted nor copied into the image"
            if rel is not None:
                assert_repo_path(rel, f"service {name} refers to {path}")
                checked.add(str(rel))
    # The DAGs submit spark_jobs/drain.py from /opt/deltadrain: it must be there for them.
    assert "spark_jobs/drain.py" in checked, f"nothing refers to spark_jobs/drain.py; checked {sorted(checked)}"


def test_dockerfile_copies_exist_and_install_the_project():
    assert built_services(), "no service builds the project image"
    for name, svc in built_services().items():
        copies = image_copies(svc)
        assert copies, f"{name}: the inline Dockerfile copies nothing"
        for dest, rel in copies.items():
            assert_repo_path(rel, f"service {name}, COPY to {dest}")
        text = re.sub(r"\s+", " ", dockerfile(svc))
        assert "openjdk-17-jre-headless" in text
        assert "pip install --no-cache-dir -r requirements.txt -c constraints.txt" in text
        assert "pip install --no-cache-dir --no-deps -e ." in text
        # paths.py derives the project root from include/deltadrain: it must be /opt/deltadrain.
        paths_py = PurePosixPath("include/deltadrain/paths.py")
        assert locate(svc, PROJECT / paths_py)[1] == paths_py, f"{name}: the package is not at {PROJECT}/include"


def test_no_secret_is_written_in_the_file():
    for name, svc in services().items():
        for key, value in environment(svc).items():
            if any(word in key.upper() for word in SECRET_WORDS):
                m = INTERPOLATION.fullmatch(value.strip())
                assert m, f"{name}: {key} must be a ${{...}} reference, not a literal"
                op, arg = m.group("op") or "", m.group("arg") or ""
                assert not (op.endswith("-") and arg), f"{name}: {key} has a default: a secret in the file"
            # A password inside a URL (scheme://user:password@host) must be a reference too.
            for password in re.findall(r"://[^/:@\s]+:([^@\s]+)@", value):
                assert INTERPOLATION.fullmatch(password), f"{name}: {key} carries a literal password"


def test_scripts_escape_their_variables_and_parse():
    texts = {name: command_strings(svc) for name, svc in services().items()}
    for name, svc in built_services().items():
        texts[name] = texts[name] + [dockerfile(svc)]
    for name, strings in texts.items():
        for text in strings:
            # `$name` or `$(...)` would be filled in by compose from the host's environment.
            unescaped = re.findall(r"\$[A-Za-z_(]", text.replace("$$", ""))
            assert not unescaped, f"{name}: write $$ for the container's variables: {unescaped} in {text!r}"
    for name, svc in services().items():
        command = svc.get("command")
        if not isinstance(command, list) or len(command) != 3 or command[1] != "-c":
            continue
        script = resolve(command[2])
        if command[0] == "python":
            compile(script, f"<{name} command>", "exec")
        elif command[0] == "bash":
            assert shutil.which("bash"), "bash is needed to check the services' scripts"
            done = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
            assert done.returncode == 0, f"{name}: bash syntax error: {done.stderr}"


def test_depends_on_names_real_services_with_usable_conditions():
    for name, svc in services().items():
        deps = svc.get("depends_on") or {}
        deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        for dep, spec in deps.items():
            assert dep in services(), f"{name} depends on unknown service {dep}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services()[dep], f"{name} waits for {dep} to be healthy: no healthcheck"
            if spec["condition"] == "service_completed_successfully":
                assert services()[dep].get("restart", "no") == "no", f"{dep} is one-shot: it must not restart"


def completes_first(name: str, one_shot: str) -> bool:
    deps = services()[name].get("depends_on") or {}
    if not isinstance(deps, dict):
        return False
    return any(spec.get("condition") == "service_completed_successfully"
               and (dep == one_shot or completes_first(dep, one_shot))
               for dep, spec in deps.items())


def test_jars_are_fetched_before_anything_reads_them():
    jars = services()["jars"]
    assert jars["image"].startswith("maven:3.9-eclipse-temurin-17")
    script = " ".join(command_strings(jars))
    assert "dependency:copy-dependencies" in script and "-DincludeScope=runtime" in script
    for pom in ("/src/jvm/spark/pom.xml", "/src/jvm/kafka/pom.xml", "/src/jvm/s3/pom.xml", "/src/jvm/s3a/pom.xml"):
        assert pom in script, f"the jars service does not fetch {pom}"
    # The S3 server runs from the fetched s3 jars, after they are indexed; the s3a kind gets the S3 log store.
    assert "-f /src/jvm/s3logstore/pom.xml package" in script and "/jars/s3a/" in script
    s3 = services()["s3"]
    assert "/opt/deltadrain/jars/s3/*" in " ".join(command_strings(s3)) and completes_first("s3", "jars")
    # The log store every session's conf names is built into the spark jars, and a change to it refetches.
    assert "-f /src/jvm/logstore/pom.xml package" in script and "/jars/spark/" in script
    assert "find /src/jvm/logstore" in script
    readers = {n: s for n, s in services().items() if "DELTADRAIN_JARS" in environment(s)}
    assert {"spark-worker"} <= set(readers) and any("airflow" in n for n in readers)
    for name, svc in readers.items():
        target = PurePosixPath(environment(svc)["DELTADRAIN_JARS"])
        assert any(m.target == target and m.read_only for m in mounts(svc)), f"{name}: {target} not mounted :ro"
        assert completes_first(name, "jars"), f"{name} does not wait for the jars service to complete"
    # The drivers tell the workers' executors to read the cache where the workers mount it.
    worker = services()["spark-worker"]
    for name, svc in readers.items():
        assert environment(svc)["DELTADRAIN_WORKER_JARS"] == environment(worker)["DELTADRAIN_JARS"], name
    assert "-Dspark.worker.cleanup.enabled=true" in environment(worker)["SPARK_WORKER_OPTS"]


def airflow_services() -> dict[str, dict]:
    return {name: svc for name, svc in services().items()
            if "airflow" in name and "AIRFLOW__CORE__DAGS_FOLDER" in environment(svc)}


def test_airflow_runs_this_project():
    assert airflow_services(), "no Airflow service sets AIRFLOW__CORE__DAGS_FOLDER"
    for name, svc in airflow_services().items():
        env = {k: resolve(v) for k, v in environment(svc).items()}
        assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
        assert env["DELTADRAIN_SPARK_MASTER"] == "spark://spark-master:7077"
        assert env["AIRFLOW_CONN_SPARK_DEFAULT"].startswith("spark://spark-master:7077")
        assert env["DELTADRAIN_HOME"] == str(PROJECT / "state")
        assert locate(svc, PurePosixPath(env["DELTADRAIN_HOME"]))[0] == "volume", "DELTADRAIN_HOME: not a volume"
        for key, repo_dir in (("AIRFLOW__CORE__DAGS_FOLDER", "dags"),
                              ("AIRFLOW__CORE__PLUGINS_FOLDER", "plugins")):
            assert locate(svc, PurePosixPath(env[key])) == ("bind", PurePosixPath(repo_dir)), key
        # DELTADRAIN_CONFIG, mapped /opt/deltadrain -> repository root, is a file of the repository.
        config = PurePosixPath(env["DELTADRAIN_CONFIG"])
        assert (ROOT / config.relative_to(PROJECT)).is_file(), f"{name}: DELTADRAIN_CONFIG {config} not in the repo"
        assert locate(svc, config) == ("bind", config.relative_to(PROJECT))


def pin(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", (ROOT / "requirements.txt").read_text(), re.M | re.I)
    assert match, f"requirements.txt does not pin {name}"
    return match.group(1)


def test_images_match_the_pins_and_name_no_registry():
    images = {name: svc["image"] for name, svc in services().items() if "image" in svc}
    bases = [args[0] for svc in built_services().values()
             for word, args in dockerfile_instructions(dockerfile(svc)) if word == "FROM"]
    for image in [*images.values(), *bases]:
        first = image.split("/")[0]
        assert "/" not in image or not ("." in first or ":" in first or first == "localhost"), \
            f"{image} names a registry host"
    assert set(bases) == {f"apache/airflow:{pin('apache-airflow')}-python3.11"}
    spark = images["spark-master"]
    assert spark.startswith("apache/spark:") and spark.split(":")[1].startswith(pin("pyspark")), spark
    kafka_pom = (ROOT / "jvm" / "kafka" / "pom.xml").read_text()
    kafka_version = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", kafka_pom).group(1)
    assert images["kafka"] == f"apache/kafka:{kafka_version}"
    assert images["valkey"].startswith("valkey/valkey:")
    valkey_command = " ".join(command_strings(services()["valkey"]))
    assert "--appendonly yes" in valkey_command and "--appendfsync always" in valkey_command
    # Executors run the project's Python code: the workers run the same image as the Spark driver.
    worker, airflow = services()["spark-worker"], next(iter(airflow_services().values()))
    assert worker.get("image") == airflow.get("image") and worker.get("build") == airflow.get("build")


# --- config/pipelines.compose.yaml --------------------------------------------------------------------

COMPOSE_CONFIG = ROOT / "config" / "pipelines.compose.yaml"
BASE_CONFIG = ROOT / "config" / "pipelines.yaml"
# The addresses, and the embedded Valkey's login (the compose Valkey has no ACL user).
ADDRESS_KEYS = ("url", "bootstrap_servers", "connection_id")


def test_compose_config_differs_only_in_source_addresses_logins_and_the_executor():
    from deltadrain.config import load_config

    base, ours = load_config(BASE_CONFIG), load_config(COMPOSE_CONFIG)
    sources = {p.name: p.source for p in ours.pipelines}
    assert sources["orders"].url == "valkey://valkey:6379/0"
    assert sources["clicks"].bootstrap_servers == "kafka:9092"
    # Those names are compose services, and Kafka advertises that listener on the compose network.
    assert {"valkey", "kafka"} <= set(services())
    assert "PLAINTEXT://kafka:9092" in environment(services()["kafka"])["KAFKA_ADVERTISED_LISTENERS"]

    # Its DAGs submit to the cluster: Compose runs no Spark Connect server.
    assert (ours.spark.executor, base.spark.executor) == ("submit", "connect")

    def without_addresses(data: dict) -> dict:
        for pipeline in data["pipelines"]:
            for key in ADDRESS_KEYS:
                pipeline["source"].pop(key, None)
        data.pop("spark", None)
        return data

    assert without_addresses(ours.model_dump()) == without_addresses(base.model_dump())
    # The YAML itself too, so that no setting differs by being spelled out at its default.
    raw = {p: yaml.safe_load(p.read_text()) for p in (BASE_CONFIG, COMPOSE_CONFIG)}
    assert without_addresses(raw[COMPOSE_CONFIG]) == without_addresses(raw[BASE_CONFIG])


def test_airflow_creates_the_pipeline_pools_before_it_schedules():
    """Tasks in a pool that does not exist are never scheduled: the pools exist before standalone runs."""
    for name, svc in airflow_services().items():
        script = resolve(svc["command"][2])
        lines = [line.strip() for line in script.splitlines()]
        assert "deltadrain pools" in lines, f"{name}: its start does not run `deltadrain pools`"
        assert lines.index("airflow db migrate") < lines.index("deltadrain pools") \
            < lines.index("exec airflow standalone"), f"{name}: migrate, then pools, then standalone"
