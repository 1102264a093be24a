"""A transform that kills its drain run on one message: what a message that crashes the process (a
native library's fault, running out of memory) does to a run. The tests of dead runs use it."""

CRASH_MARKER = "__crash__"


def crash_on_marker(df):
    """Kills the `deltadrain.cli` process whose Spark task meets a `status` of CRASH_MARKER (SIGKILL:
    nothing of the run gets to clean up); every other row passes unchanged. A drain outside that
    command (in the test process) is not killed, so the tests only use it through the CLI."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(status):
        # Defined in here so that Spark ships it by value: the workers need not import this module.
        import os
        import signal

        if status != CRASH_MARKER:
            return status
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"deltadrain.cli" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))
