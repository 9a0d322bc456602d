"""Webhooks for submitters: a POST to the URL a submission names (or its API key's default)
when the run ends (succeeded, compensated, failed, needs_attention) or waits for an approval.

The outbox: a trigger on ``sagas_run`` (migration 0001) writes a ``Delivery`` row in the very
statement that changes the run's status, whichever writer made it (the journal's hand-made SQL,
a service, the admin): never lost when a worker dies after its status write, never made for a
change that was rolled back. Beat's ``webhooks_sweep`` claims the due rows and a task sends
each (``services.delivery_send``), retried with exponential backoff for a day, every attempt
stored (``Attempt``).
"""
