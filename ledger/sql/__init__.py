"""The data-access layer: every statement Fenceline writes as SQL text, below the services.

The ORM compiles every queryset anew; on the fenced path that compiling cost more CPU than
PostgreSQL spent running the statements (docs/performance.md, "Where the time goes"). The
statements here are written once per shape from the models' own metadata (tables and
columns), kept per process, and sent by :func:`ledger.sql.connection.execute`: bound
server-side with PostgreSQL's own ``$n`` placeholders and prepared from the
``prepare_threshold``-th use on a connection. Services call the functions of this package
with values and get rows, instances or counts back; they build no SQL themselves.

- ``connection``: ``execute``, the one way a statement of this package reaches PostgreSQL;
- ``rows``: one model's rows by equality (get, select, insert, update) without the ORM;
- ``fence``: the fence's locking statement and the sweeps' locked runs;
- ``chain``: a transition's commit (its held-back updates, its events and the run head);
- ``costs``: a dispatch's charges and a reservation's settlement;
- ``throttle``: failed worker tokens counted per client address in a window;
- ``lifespan``, ``credentials``, ``upgrades``, ``evidence``, ``reads``: the rest, by domain.
"""
