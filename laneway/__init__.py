"""Laneway: a Celery worker fleet for NLP inference."""

__version__ = "0.1.0"
