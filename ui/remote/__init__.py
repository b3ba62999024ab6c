"""The window's side of serving and remote engines: the Server switch, "Connect to a server…", and the
dashboard that watches a remote engine from its counters."""
