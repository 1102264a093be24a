"""The view's stand-ins for unit tests: an Airflow auth manager that allows or refuses as told."""

from __future__ import annotations


class FakeAuth:
    """Answers `is_authorized_dag` as Airflow's auth manager would: runs (POST) by `allow_run`, reads by `allow_read`."""

    def __init__(self, allow_read=True, allow_run=True):
        self.allow_read, self.allow_run = allow_read, allow_run

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        return self.allow_run if method == "POST" else self.allow_read
