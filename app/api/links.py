"""OpenAPI links: which answer gives the values another call takes (a topic's name, a message's
id and lease token, a campaign's name, an operation's id, a schedule's name), so that a
client or a conformance tool can follow a message from its enqueue to its read, move,
cancel, lease, ack, nack, extend and redrive, and a campaign to its operations.

The links are stated here, in one table, and added to the documented responses by the
Links apispec plugin (app.api.openapi_file): a link to an operation or from a response the
routes do not document is an error when the document is built."""

from __future__ import annotations

import copy
from typing import Any

from apispec import BasePlugin

TOPIC = "/v1/topics/{topic}"
MESSAGE = f"{TOPIC}/messages/{{message_id}}"
CAMPAIGN = f"{TOPIC}/campaigns/{{campaign}}"
SCHEDULE = f"{TOPIC}/schedules/{{name}}"

# what a link's target takes, as the runtime expression of where the source gives it
Values = dict[str, str]


def _ref(path: str, method: str) -> str:
    """The operationRef of an operation: a JSON pointer into this document's paths."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _link(path: str, method: str, description: str, parameters: Values,
          body: dict[str, Any] | None = None) -> dict[str, Any]:
    link: dict[str, Any] = {"operationRef": _ref(path, method), "description": description,
                            "parameters": dict(parameters)}
    if body is not None:
        link["requestBody"] = copy.deepcopy(body)
    return link


def _topic_calls(topic: str) -> dict[str, dict[str, Any]]:
    """The calls that put things on a topic, whose name is given by `topic`, and list them."""
    on = {"topic": topic}
    # due now, in a campaign: the calls that follow (lease, then ack, nack, extend; the
    # campaign's) have a message and a campaign to act on
    message = {"payload": {"hello": "world"}, "campaign": "welcome"}
    return {
        "EnqueueMessage": _link(f"{TOPIC}/messages", "post", "Enqueue a message due now.", on,
                                message),
        "EnqueueBatch": _link(f"{TOPIC}/messages:batch", "post", "Enqueue messages due now.",
                              on, {"messages": [message]}),
        "LeaseMessages": _link(f"{TOPIC}/leases", "post", "Lease its due messages.", on),
        "CreateSchedule": _link(SCHEDULE, "put", "Put a schedule on it.", on),
        "ListDeadLetters": _link(f"{TOPIC}/dead-letters", "get", "Its dead messages.", on),
        "ListCampaigns": _link(f"{TOPIC}/campaigns", "get", "Its campaigns.", on),
        "ListSchedules": _link(f"{TOPIC}/schedules", "get", "Its schedules.", on),
        "RotateSigningSecret": _link(f"{TOPIC}/signing-secret:rotate", "post",
                                     "Give it a new webhook signing secret.", on),
        "StartOperation": _link(f"{TOPIC}/operations", "post",
                                "Cancel, shift, pause or resume messages of it.", on),
    }


def _message_calls(message_id: str, leases: bool = True) -> dict[str, dict[str, Any]]:
    """The calls on a message of the request's topic whose id is given by `message_id`."""
    on = {"topic": "$request.path.topic", "message_id": message_id}
    calls = {
        "GetMessage": _link(MESSAGE, "get", "Read the message.", on),
        "RescheduleMessage": _link(MESSAGE, "patch", "Move the message.", on),
        "CancelMessage": _link(MESSAGE, "delete", "Cancel the message.", on),
        "RetryMessage": _link(f"{MESSAGE}/retry", "post", "Bring it back if it is dead.", on),
    }
    if leases:
        # due now, a message is leased by a call that waits for it
        calls["LeaseMessages"] = _link(f"{TOPIC}/leases", "post", "Lease the topic's due "
                                       "messages, this one among them once due.",
                                       {"topic": "$request.path.topic"}, {"wait_ms": 1000})
    return calls


def _lease_calls(message_id: str, token: str) -> dict[str, dict[str, Any]]:
    """The calls of a lease holder: the message by `message_id`, its lease by `token`."""
    on = {"topic": "$request.path.topic", "message_id": message_id}
    held = {"lease_token": token}
    return {
        "AckMessage": _link(f"{MESSAGE}/ack", "post", "Ack the leased message.", on, held),
        "NackMessage": _link(f"{MESSAGE}/nack", "post", "Give the leased message back.", on,
                             held),
        "ExtendLease": _link(f"{MESSAGE}/extend", "post", "Keep the lease longer.", on, held),
    }


def _campaign_calls(campaign: str) -> dict[str, dict[str, Any]]:
    on = {"topic": "$request.path.topic", "campaign": campaign}
    return {
        "GetCampaign": _link(CAMPAIGN, "get", "Read the campaign.", on),
        "ControlCampaign": _link(CAMPAIGN, "patch", "Shift, pause, resume or pace it.", on),
        "CancelCampaign": _link(CAMPAIGN, "delete", "Cancel the campaign.", on),
    }


def _operation_call(op_id: str) -> dict[str, dict[str, Any]]:
    return {"GetOperation": _link(f"{TOPIC}/operations/{{op_id}}", "get",
                                  "Follow the operation.",
                                  {"topic": "$request.path.topic", "op_id": op_id})}


def _schedule_calls(name: str) -> dict[str, dict[str, Any]]:
    on = {"topic": "$request.path.topic", "name": name}
    return {
        "GetSchedule": _link(SCHEDULE, "get", "Read the schedule.", on),
        "ReplaceSchedule": _link(SCHEDULE, "put", "Replace the schedule.", on),
        "DeleteSchedule": _link(SCHEDULE, "delete", "Delete the schedule.", on),
    }


_ENQUEUED = {**_message_calls("$response.body#/id"),
             **_campaign_calls("$request.body#/campaign")}
_LEASED = {**_lease_calls("$response.body#/messages/0/id",
                          "$response.body#/messages/0/lease/token"),
           "AckMessages": _link(f"{TOPIC}/acks", "post", "Ack the leased messages.",
                                {"topic": "$request.path.topic"}, {"acks": [
                                    {"id": "$response.body#/messages/0/id",
                                     "lease_token": "$response.body#/messages/0/lease/token"}]}),
           **_message_calls("$response.body#/messages/0/id", leases=False)}
_HELD = _lease_calls("$request.path.message_id", "$request.body#/lease_token")
_SAME_MESSAGE = _message_calls("$request.path.message_id")
_OPERATION = _operation_call("$response.body#/operation/id")

# (path, method) -> status -> link name -> link
LINKS: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {
    ("/v1/topics", "get"): {"200": _topic_calls("$response.body#/topics/0/name")},
    (TOPIC, "put"): {"200": _topic_calls("$response.body#/name"),
                     "201": _topic_calls("$response.body#/name")},
    (TOPIC, "get"): {"200": _topic_calls("$response.body#/name")},
    (f"{TOPIC}/messages", "post"): {"201": _ENQUEUED, "200": _ENQUEUED},
    (f"{TOPIC}/messages:batch", "post"): {
        "200": _message_calls("$response.body#/results/0/id")},
    (MESSAGE, "get"): {"200": {**_message_calls("$response.body#/id"),
                               **_campaign_calls("$response.body#/campaign")}},
    (MESSAGE, "patch"): {"200": _message_calls("$response.body#/id")},
    (f"{MESSAGE}/retry", "post"): {"200": _message_calls("$response.body#/id")},
    (f"{TOPIC}/leases", "post"): {"200": _LEASED},
    (f"{MESSAGE}/extend", "post"): {"200": _HELD},
    (f"{MESSAGE}/nack", "post"): {"204": _SAME_MESSAGE},
    (f"{MESSAGE}/ack", "post"): {"204": {"GetMessage": _SAME_MESSAGE["GetMessage"]}},
    (f"{TOPIC}/messages", "get"): {"200": {
        "NextPage": _link(f"{TOPIC}/messages", "get", "The search's next page (same filters).",
                          {"topic": "$request.path.topic",
                           "page_token": "$response.body#/next_page_token"}),
        **_message_calls("$response.body#/messages/0/id")}},
    (f"{TOPIC}/dead-letters", "get"): {
        "200": _message_calls("$response.body#/messages/0/id", leases=False)},
    (f"{TOPIC}/campaigns", "get"): {"200": _campaign_calls("$response.body#/campaigns/0/campaign")},
    (CAMPAIGN, "get"): {"200": _campaign_calls("$response.body#/campaign")},
    (CAMPAIGN, "patch"): {"202": _OPERATION,
                          "200": _campaign_calls("$response.body#/campaign")},
    (CAMPAIGN, "delete"): {"202": _OPERATION},
    (f"{TOPIC}/operations", "post"): {"202": _OPERATION},
    (SCHEDULE, "put"): {"200": _schedule_calls("$response.body#/name"),
                        "201": _schedule_calls("$response.body#/name")},
    (f"{TOPIC}/schedules", "get"): {"200": _schedule_calls("$response.body#/schedules/0/name")},
}


class Links(BasePlugin):
    """Adds LINKS to the responses of the operations as the document is built."""

    def operation_helper(self, path: str | None = None,
                         operations: dict[str, Any] | None = None, **kwargs: Any) -> None:
        for method, operation in (operations or {}).items():
            by_status = LINKS.get((path or "", method))
            if by_status is None:
                continue
            for status, links in by_status.items():
                responses = operation.get("responses", {})
                response = responses.get(status, responses.get(int(status)))
                if not isinstance(response, dict):
                    raise ValueError(f"links from {method.upper()} {path} {status}, which it "
                                     "does not document")
                # a copy of each: a dict met twice would be a YAML alias in the document
                response["links"] = {name: copy.deepcopy(link) for name, link in links.items()}
