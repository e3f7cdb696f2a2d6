"""Webhook signing secrets and signatures (openapi.yaml, "Webhook signatures").

Standard Webhooks: `webhook-signature` is `v1,<base64 HMAC-SHA256>` of
"{webhook-id}.{webhook-timestamp}.{body}", one per active secret, space-separated. A secret is
`whsec_` + base64 of its key bytes. Topics made before these secrets hold a plain string,
whose key is its UTF-8 bytes: shown as `whsec_` + base64 of those, it signs exactly as before.
The deprecated `Duetime-Signature` is the lowercase hex HMAC-SHA256 of the body alone, under
the current secret's key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Sequence

PREFIX = "whsec_"
KEY_BYTES = 32


def new_secret() -> str:
    """A new topic's secret: `whsec_` + base64 of KEY_BYTES random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def key_of(secret: str) -> bytes:
    """The HMAC key of a secret as stored or as shown (a `whsec_` secret's base64 decoded;
    an older topic's plain string, its UTF-8 bytes). ValueError for a `whsec_` secret that
    is not base64."""
    if secret.startswith(PREFIX):
        try:
            return base64.b64decode(secret[len(PREFIX):] + "==", validate=False)
        except binascii.Error as exc:
            raise ValueError("the secret is not base64 after whsec_") from exc
    return secret.encode("utf-8")


def shown(secret: str) -> str:
    """The secret as users see it: always the `whsec_` form, for the same key."""
    if secret.startswith(PREFIX):
        return secret
    return PREFIX + base64.b64encode(secret.encode("utf-8")).decode("ascii")


def standard_signature(secrets_: Sequence[str], message_id: str, timestamp_s: int,
                       body: bytes) -> str:
    """The `webhook-signature` header: one `v1,<base64>` per secret, space-separated."""
    signed = f"{message_id}.{timestamp_s}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key_of(s), signed, hashlib.sha256).digest()).decode()
        for s in secrets_)


def body_signature(secret: str, body: bytes) -> str:
    """The deprecated `Duetime-Signature`: lowercase hex HMAC-SHA256 of the body bytes."""
    return hmac.new(key_of(secret), body, hashlib.sha256).hexdigest()
