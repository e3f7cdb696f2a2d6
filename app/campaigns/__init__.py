"""Campaigns: their controls (pause, pacing, cancel), the operations that change their
messages, and what a process knows of the controls."""
