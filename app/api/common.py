"""Helpers shared by the /v1 views: the request's tenant and services."""

from __future__ import annotations

from flask import current_app, g

from app.services import Services

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


def services() -> Services:
    svc: Services = current_app.extensions["duetime"]
    return svc


def tenant() -> str:
    value: str = g.tenant
    return value
