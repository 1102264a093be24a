"""The Spark runtime: the session (`session`), the JVM artefacts it runs on (`jars`, `java`), the
driver's class-data archive (`archive`) and the daemons its Python workers fork from (`warm_daemon`; a
Connect server's: `python_daemon`).
"""

__all__ = ["archive", "jars", "java", "python_daemon", "session", "warm_daemon"]
