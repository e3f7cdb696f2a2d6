"""Checks of path parameters (names and ids), answered as 400 problems naming the field."""

from __future__ import annotations

from app.errors import InvalidInput
from app.ids import CLIENT_ID, NAME


def check_name(field: str, value: str) -> None:
    if not NAME.match(value):
        raise InvalidInput(f"Invalid {field} name.", {field: [f"Must match {NAME.pattern}."]})


def check_message_id(value: str) -> None:
    if not CLIENT_ID.match(value):
        raise InvalidInput("Invalid message id.", {"id": [f"Must match {CLIENT_ID.pattern}."]})
