"""The Spark runtime: the session (`session`), the JVM artefacts it runs on (`jars`, `java`), the
driver's class-data archive (`archive`) and the Connect server's Python workers (`python_daemon`).
"""

__all__ = ["archive", "jars", "java", "python_daemon", "session"]
