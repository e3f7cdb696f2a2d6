"""A message's life apart from its delivery: enqueue (and its group commit), placing
pointers on the timeline, transitions, reads, cancels, moves and dead letters."""
