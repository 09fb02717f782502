"""Pure helpers that know no Celery, Flask or database: failure isolation, safe file
access, JSON encoding, prices, webhooks, injected faults."""
