"""Settings: one object read from the LANEWAY_* environment in one place, and start-up."""
