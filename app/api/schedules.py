"""/v1/topics/{topic}/schedules views."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView

from app.api.common import SECURITY, services, tenant
from app.api.json_body import Blueprint
from app.api.messages import payload_fields
from app.api.validation import check_name
from app.models import Payload
from app.schedules import manage as usecases
from app.schemas.schedules import ScheduleListSchema, SchedulePutSchema, ScheduleSchema
from app.store.schedules import Schedule
from app.topics.manage import get_topic_cached

blp = Blueprint("schedules", __name__, url_prefix="/v1/topics/<name:topic>",
                description="Recurring schedules: cron in a time zone, each fire a message.")


def schedule_view(s: Schedule) -> dict[str, Any]:
    return {
        "name": s.name, "cron": s.cron, "timezone": s.timezone, "priority": s.priority,
        "campaign": s.campaign, "start_at": s.start_at, "end_at": s.end_at,
        "misfire": s.misfire, "created_at": s.created_at, "updated_at": s.updated_at,
        "next_fire_times": usecases.next_fire_times(s, services().clock()),
        **{k: v for k, v in payload_fields(Payload(s.payload, s.encoding, {})).items()
           if k != "headers"},
    }


@blp.route("/schedules")
class ScheduleCollection(MethodView):
    @blp.doc(security=SECURITY)
    @blp.response(200, ScheduleListSchema)
    def get(self, topic: str) -> dict[str, Any]:
        """The topic's schedules."""
        found = get_topic_cached(services(), tenant(), topic)
        return {"schedules": [schedule_view(s) for s in services().schedules.all(found.uid)]}


@blp.route("/schedules/<name:name>")
class ScheduleItem(MethodView):
    @blp.doc(security=SECURITY)
    @blp.arguments(SchedulePutSchema())
    @blp.response(200, ScheduleSchema, description="Replaced.")
    @blp.alt_response(201, schema=ScheduleSchema, description="Created.")
    @blp.alt_response(409, description="Its waiting fires would change campaign, or its "
                                       "campaign is cancelled.")
    def put(self, body: dict[str, Any], topic: str, name: str) -> tuple[dict[str, Any], int]:
        """Create or replace a schedule."""
        check_name("schedule", name)
        found = get_topic_cached(services(), tenant(), topic)
        made, created = usecases.put_schedule(services(), found, name, body)
        return schedule_view(made), 201 if created else 200

    @blp.doc(security=SECURITY)
    @blp.response(200, ScheduleSchema)
    def get(self, topic: str, name: str) -> dict[str, Any]:
        """A schedule, with its next fire times."""
        check_name("schedule", name)
        found = get_topic_cached(services(), tenant(), topic)
        return schedule_view(usecases.get_schedule(services(), found, name))

    @blp.doc(security=SECURITY)
    @blp.response(204)
    def delete(self, topic: str, name: str) -> None:
        """Delete a schedule: no further fire; its fires produced and not yet handed out are
        cancelled."""
        check_name("schedule", name)
        found = get_topic_cached(services(), tenant(), topic)
        usecases.delete_schedule(services(), found, name)
