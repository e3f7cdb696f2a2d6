"""Spark jobs on the same tables as the API: `duetime spark import` (bulk scheduling from
CSV, JSON lines or Parquet, written as the API would write it) and `duetime spark report`
(delivery analytics and the campaign funnel, as Parquet, CSV and charts)."""
