"""Releaser workers (`duetime releaser`): slot ownership, the walk into a timer heap, webhook
push through a POST process, the pull broker, recurring-schedule fires
and campaign operations. Entry point: workers/releaser.py. Pull consumption works without
them; webhook topics, schedules and campaign operations need at least one."""
