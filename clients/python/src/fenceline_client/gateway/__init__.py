"""fenceline-mcp: an MCP gateway that makes every tool call of its upstream MCP servers a fenced
Fenceline operation (docs/gateway.md). Its public surface, kept stable for the demo, the
simulator, the console and the benchmark:

Installed with ``pip install 'fenceline-client[gateway]'`` (the ``mcp`` SDK, ``detect-secrets``);
this package's modules import them, so nothing here is imported by ``fenceline_client`` itself.

Command line (console script ``fenceline-mcp``, or ``python -m fenceline_client.gateway``)::

    fenceline-mcp [--config FILE] [--external-id ID | --run-id ID] [--http HOST:PORT] [-- COMMAND ARGS...]

    FENCELINE_URL                      the server (required)
    FENCELINE_TOKEN / _TOKEN_FILE      the worker token the gateway acts with (required)
    --http HOST:PORT                   streamable HTTP at http://HOST:PORT/mcp instead of stdio

Modules: ``config`` (``build``, ``read_file``, ``Config``: the file's format is in its
docstring), ``session`` (``GatewaySession``: one MCP session, one run; ``SESSION_EVENT``,
``REDACTED_EVENT``, ``Refusal``), ``server`` (``make_server(config)``: the SDK's low-level
``Server``; ``main``), ``upstream`` (``Link``: one upstream connection), ``boundary``
(``redact_text``, ``find_secret``: the secret boundary's gateway side), ``cli`` (the console
script).

Sessions: over HTTP one per ``Mcp-Session-Id``; over stdio, and for the 2026-07-28 protocol's
stateless requests, the process's one session. The lease is released when the session ends
(stdin closed, SIGTERM or SIGINT, the HTTP session ended or idled out).

Names: with one upstream its tools keep their names; with several, ``<upstream>__<tool>``
(``config.SEPARATOR``). The run: ``--run-id`` joins it; else it is created (or joined) with the
external id ``--external-id``, or ``mcp:<MCP session id or a new uuid>``.

What the run's chain holds (event types, their fields exactly):

    x.mcp.session   {session_id, client_name, client_version, protocol_version, upstreams}
    x.mcp.redacted  {tool, operation_id, kinds, count}   (no value is ever recorded)

Each tools/call is an operation: tool = the name the host called, action and resource from the
gateway's contract (default: the tool's name and the upstream's name), provider = the
upstream's name (unless the tenant's contract names one), args_digest = ``sha256:<hex>`` of the canonical JSON arguments,
idempotency_key = ``mcp-<sha256 of run id, tool, canonical arguments, ordinal>``, and at the
outcome provider_request_id = ``sha256:<hex>`` of the upstream's result. A refusal is a result
with ``isError`` and one line ``CODE: reason`` (``session.Refusal``).
"""
