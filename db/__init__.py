"""Laneway's database: models, sessions, and the queries more than one room uses."""
