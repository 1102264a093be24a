"""The one line of a failure that reaches the user (run summaries, dead letters, Airflow's failure message)."""

from deltadrain.errors import error_line

# What PySpark raises when a Python worker fails (a claim task, a UDF): a banner, the worker's traceback.
WORKER = """
  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker.py", line 1, in main
    process()
  File "/work/include/deltadrain/claim.py", line 178, in record_batch
    raise ValueError(unstorable_id_message(chunk.stream, unstorable_id(chunk.positions)))
ValueError: stream 'orders:{0}': entry 253402300800000-0 has an id deltadrain cannot store (...)
"""

# The same inside a JVM error (Py4J), chained, with the JVM's frames after it.
JVM = """An error occurred while calling o1234.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "worker.py", line 2, in main
    first()
KeyError: 'data'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "worker.py", line 9, in main
    second()
valkey.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused.

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:784)
"""


class PythonException(Exception):
    pass


def test_a_python_workers_error_is_its_own_exception_line_not_the_banner():
    assert error_line(PythonException(WORKER)) == (
        "ValueError: stream 'orders:{0}': entry 253402300800000-0 has an id deltadrain cannot store (...)")


def test_a_chained_worker_error_inside_a_jvm_error_is_the_last_exception():
    assert error_line(Exception(JVM)) == ("valkey.exceptions.ConnectionError: Error 111 connecting to 127.0.0.1:6379. "
                                          "Connection refused.")


def test_a_transforms_raise_error_is_its_message():
    text = ("[USER_RAISED_EXCEPTION] poison message: transform refused event e-1 SQLSTATE: P0001\n"
            "JVM stacktrace:\norg.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] poison ...")
    assert error_line(Exception(text)) == "[USER_RAISED_EXCEPTION] poison message: transform refused event e-1 SQLSTATE: P0001"


def test_a_jvm_error_without_a_python_traceback_is_its_first_named_exception():
    text = ("An error occurred while calling o77.execute.\n: org.apache.spark.sql.delta.ConcurrentAppendException: "
            "Files were added to the root of the table by a concurrent update.\n\tat io.delta.Foo.bar(Foo.scala:1)")
    assert error_line(Exception(text)) == ("ConcurrentAppendException: Files were added to the root of the table by a "
                                           "concurrent update.")


def test_a_one_line_error_keeps_its_type_and_whole_message():
    # Not cut at an exception name inside the message.
    assert error_line(ValueError("could not parse: KeyError: 'x'")) == "ValueError: could not parse: KeyError: 'x'"
    assert error_line(RuntimeError("row 3: KeyError: 'x'\nsee the log")) == "RuntimeError: row 3: KeyError: 'x'"
    assert error_line(RuntimeError("  \n ")) == "RuntimeError"
    assert error_line(RuntimeError()) == "RuntimeError"
    assert error_line(ValueError("x" * 900)) == "ValueError: " + "x" * 488  # at most 500 characters
