"""What happens to a job: submission, routing, admission, results, the inbox and outbox,
settling, cancelling and retrying. No Celery task or Flask view lives here."""
