"""Running workers: one command per queue, device choice and model loading per process."""
