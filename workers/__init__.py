"""Releaser workers (`duetime-admin releaser`): slot ownership, the walk, the broker that takes what
it read for lease calls and for webhook POSTs (sent by a POST process), recurring-schedule
fires and campaign operations. Entry point: workers/releaser.py. Pull consumption works without
them; webhook topics, schedules and campaign operations need at least one."""
