"""Laneway's database: models, sessions, and the queries more than one room uses, by
subject (accounts, intake, results, and the small shared ones in common)."""
