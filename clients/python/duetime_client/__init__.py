"""duetime's Python client: the typed HTTP client, the consumer helper, the webhook signature
check and the `duetime` command. It needs urllib3 and nothing of the server."""

from duetime_client.client import (
    ApiError,
    ApiTimeout,
    ApiUnreachable,
    Client,
    Consumer,
    SignatureCheck,
    verify_signature,
    verify_webhook,
)

__version__ = "0.1.0"

__all__ = ["ApiError", "ApiTimeout", "ApiUnreachable", "Client", "Consumer", "SignatureCheck",
           "__version__", "verify_signature", "verify_webhook"]
