"""The fleet simulator (``manage.py simulate``): its supervisor and a sandbox payments provider.
The worker processes it runs are the client package's (``fenceline_client.simulated_worker``)."""
