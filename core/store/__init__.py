"""Structures kept in Redis: the connection, the result cache, usage counters, the
interactive request protocol and the fleet's marks."""
