"""Fixtures the view's unit tests share."""

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
