"""Webhook notifications (issue 15): a tenant's admins set endpoints (``endpoints``); a job
turns current conditions into deliveries, once per condition and endpoint (the approvals
app's scan, ``approvals/services/notifications.py``: some conditions are its queues); another
sends them, signed, with retries and backoff (``delivery``). Nothing here is called from the
fenced path: a failing or hanging endpoint slows only the delivery job."""
