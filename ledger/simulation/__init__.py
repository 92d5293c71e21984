"""The fleet simulator (``manage.py simulate``): worker processes built on the Python
client, a sandbox payments provider, and the faults that production brings."""
