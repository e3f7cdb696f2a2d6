"""Spark jobs for bulk imports and analytics (issue 5): not built yet."""
