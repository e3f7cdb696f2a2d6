"""Spark jobs on the same tables as the API: `duetime-admin spark import` (bulk scheduling from
CSV, JSON lines or Parquet, written as the API would write it) and `duetime-admin spark report`
(delivery analytics and the campaign funnel, as Parquet, CSV and charts)."""
