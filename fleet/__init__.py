"""The command line and the supervisor: `laneway ...`, the fleet of worker processes."""
