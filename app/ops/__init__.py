"""Running duetime: metrics, logs, per-tenant quotas, load shedding, delivery-lag records
and clock checks."""
