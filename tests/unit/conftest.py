"""Fixtures unit test modules share: the view's app, the fake schema registry."""

from __future__ import annotations

import pytest


@pytest.fixture
def client_for(monkeypatch, cfg):
    """The view's app with a stand-in user and the auth manager given to `make`."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    from deltadrain.orchestration.view.app import create_app

    def make(auth):
        monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: auth)
        app = create_app()
        app.dependency_overrides[get_user] = lambda: object()
        return TestClient(app)

    return make


@pytest.fixture
def server():
    """The fake schema registry (tests.support.registry), started for one test."""
    from tests.support.registry import fake_registry

    with fake_registry() as srv:
        yield srv
