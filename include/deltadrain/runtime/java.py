"""The JDK that Spark and the Kafka broker start, found as spark-class finds it, and checked once."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from deltadrain.errors import PrerequisiteError


def java_binary() -> str:
    """The `java` Spark (and the Kafka broker) will start: $JAVA_HOME/bin/java when JAVA_HOME is set,
    as spark-class does, else the one on PATH."""
    if home := os.environ.get("JAVA_HOME"):
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise PrerequisiteError(f"JAVA_HOME={home} has no bin/java; point JAVA_HOME at a JDK 17 or newer, "
                                    "or unset it to use the `java` on PATH.")
        return java
    on_path = shutil.which("java")
    if on_path is None:
        raise PrerequisiteError("Java 17 is needed by Spark and Kafka but `java` is not on PATH "
                                "(Debian: `apt-get install -y openjdk-17-jdk-headless`).")
    return on_path


def java_home() -> Path | None:
    """The home of the JDK `java_binary` starts, or None without one."""
    try:
        return Path(java_binary()).resolve().parent.parent
    except PrerequisiteError:
        return None


def check_java() -> str:
    """The `java` to use, checked to be Java 17 or newer; a missing or old one names the fix."""
    java = java_binary()
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    if '"1.' in out or not any(f'"{v}' in out for v in range(17, 30)):
        first = out.splitlines()[0] if out else "nothing"
        raise PrerequisiteError(f"Java 17 or newer is needed; `{java} -version` says: {first} "
                                "(Debian: `apt-get install -y openjdk-17-jdk-headless`, or set JAVA_HOME to a JDK 17).")
    return java
