"""Pure foundations shared by every room: message ids, API times, the timeline's
bucket and shard math, bounded runs. No I/O."""
