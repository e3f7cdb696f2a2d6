"""Recurring schedules and the wall-clock rules they and enqueues use: cron fire times and
quiet hours."""
