"""Topics: create, update, read, list, delete, stats, and the API process's cache of them."""
