"""The production server's settings: ``gunicorn -c python:console.gunicorn_conf``.

The one place they are kept: docs/production.md, ``make serve``, the Dockerfile and
compose.yaml all start gunicorn with this file and add only the address (``--bind``).
docs/production.md, "gunicorn", says why each value is what it is; the slow-client figures
come from ``tests/bench/slow_clients.py``.
"""

# Threads, not one process per request: a client that stalls mid-request holds one thread
# (and only for console.serving.CLIENT_IO_TIMEOUT_S), never the worker, which keeps answering
# and reporting to the arbiter.
worker_class = "console.serving.ThreadWorker"
workers = 4
threads = 16
# A kept-alive connection waits this long for its next request, on the worker's poller (no thread).
keepalive = 5
# A worker that stops reporting for this long is killed and replaced.
timeout = 30
# On a restart, requests in progress get this long to finish.
graceful_timeout = 30
# No gunicorn.ctl management socket (gunicorn >= 25.1 makes one under $HOME otherwise).
control_socket_disable = True
