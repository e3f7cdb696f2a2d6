"""Helpers shared by the /v1 views: the request's tenant and services."""

from __future__ import annotations

from flask import current_app, g

from app.errors import DuetimeError
from app.messages.enqueue import EnqueueResult, NewMessage
from app.messages.group_commit import GroupCommit
from app.services import Services

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


def services() -> Services:
    svc: Services = current_app.extensions["duetime"]
    return svc


def enqueue_groups() -> GroupCommit[NewMessage, EnqueueResult]:
    """This process's group commit of one-message enqueues (app.messages.group_commit)."""
    groups: GroupCommit[NewMessage, EnqueueResult] = current_app.extensions[
        "duetime_groups"]["enqueue"]
    return groups


def ack_groups() -> GroupCommit[tuple[str, str], DuetimeError | None]:
    """This process's group commit of one-message acks (app.messages.group_commit)."""
    groups: GroupCommit[tuple[str, str], DuetimeError | None] = current_app.extensions[
        "duetime_groups"]["ack"]
    return groups


def tenant() -> str:
    value: str = g.tenant
    return value
