"""Releaser workers (issue 4): not built yet. Pull consumption works without them."""
