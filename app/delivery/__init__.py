"""Finding and handing out what is due: the releasers' scans, the pull broker's API end
and its wire, leases and acks, fair order, push outcomes, wake-ups, webhook targets and
signatures."""
