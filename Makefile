# The two commands of README.md:
#   make demo   the console and API with a seeded tenant and worker, on the embedded default
#   make test   the whole test suite (PostgreSQL at 127.0.0.1:5432, Redis at 127.0.0.1:6379)
# make serve: the production server exactly as docs/production.md starts it (gunicorn with
# console/gunicorn_conf.py), on SERVE_ADDR; the settings come from the environment as there
# make test-ha: database failover on pg_auto_failover (tests/ha/, apart from make test): builds a
# monitor, a primary and a secondary with pg_autoctl in a temp dir (installs Debian's packages
# when missing; run as root: the nodes run as the postgres OS user), serves the app against the
# multi-host URL, kills the primary; docs/production.md "High availability"
# make lint: ruff (lint and format), mypy, the import contracts (lint-imports, pyproject.toml), no
# missing migration, and the TypeScript client's schema snapshot and generated types up to date
# (Node needed; CI runs it before the tests)
# make schema: after a change to the worker API, the snapshot of its OpenAPI schema
# (clients/typescript/openapi.json) and the TypeScript client's types generated from it
# Benchmarks (docs/performance.md): make bench, make bench-all, make bench-ledger, make bench-console, make bench-reapers,
# make bench-reconcilers, make bench-contention, make bench-backfill, make bench-gateway, make bench-server

DATABASE_URL_TEST ?= postgres://postgres@127.0.0.1:5432/fenceline
REDIS_URL_TEST ?= redis://127.0.0.1:6379/15
# The console benchmark's own database: seeded once (~1M runs, 20M events), kept between runs.
DATABASE_URL_SCALE ?= postgres://postgres@127.0.0.1:5432/fl_scale
PYTEST_WORKERS ?= 2
# Where make demo serves; empty is 127.0.0.1:8000 (DEMO_ADDR=8010 or DEMO_ADDR=0.0.0.0:8000).
DEMO_ADDR ?=
# Where make serve listens (host:port).
SERVE_ADDR ?= 127.0.0.1:8000

.PHONY: demo serve simulate test test-ha lint schema bench bench-all bench-ledger bench-console bench-reapers bench-reconcilers bench-contention bench-backfill bench-gateway bench-server

demo:
	@.ci/bootstrap
	.venv/bin/python manage.py demo $(DEMO_ADDR)

serve:
	@.ci/bootstrap
	exec .venv/bin/gunicorn -c python:console.gunicorn_conf console.wsgi:application --bind $(SERVE_ADDR)

simulate:
	@.ci/bootstrap
	.venv/bin/python manage.py migrate --verbosity 0
	.venv/bin/python manage.py simulate $(SIM_ARGS)

test:
	@.ci/bootstrap
	@command -v chromium >/dev/null || { echo "The browser tests need Debian's chromium: sudo apt-get install -y chromium" >&2; exit 1; }
	DATABASE_URL=$(DATABASE_URL_TEST) FENCELINE_TEST_REDIS_URL=$(REDIS_URL_TEST) FENCELINE_FAIL_ON_SKIP=1 \
		.venv/bin/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# DATABASE_URL here is only the pytest process's own (the formation's database is the test's).
test-ha:
	@.ci/bootstrap
	@command -v pg_autoctl >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql-15-auto-failover pg-auto-failover-cli >/dev/null; }
	DATABASE_URL=$(DATABASE_URL_TEST) FENCELINE_TEST_REDIS_URL=$(REDIS_URL_TEST) FENCELINE_FAIL_ON_SKIP=1 FENCELINE_TEST_HA=1 \
		.venv/bin/python -m pytest -p no:xdist -s tests/ha $(PYTEST_ARGS)

lint:
	@.ci/bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports --no-logo
	.venv/bin/python manage.py makemigrations --check --dry-run
	@command -v node >/dev/null || { echo "make lint checks the TypeScript client's types with Node 20+ (apt-get install -y nodejs npm)" >&2; exit 1; }
	$(EXPORT_SCHEMA) | cmp -s - clients/typescript/openapi.json || \
		{ echo "clients/typescript/openapi.json is not the schema the server serves: make schema" >&2; exit 1; }
	cd clients/typescript && npm run --silent check:schema

# The worker API's OpenAPI schema as served at /api/v1/openapi.json, written without a server.
EXPORT_SCHEMA = .venv/bin/python manage.py export_openapi_schema --api console.urls.api --indent 2 --sorted

schema:
	@.ci/bootstrap
	$(EXPORT_SCHEMA) > clients/typescript/openapi.json
	cd clients/typescript && npm run --silent generate

bench:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/fenced_transitions.py $(BENCH_ARGS)

# Every hot-path figure of docs/performance.md in one go (about 25 minutes on 2 cores): the fenced
# transitions with the curve, the ledger, the reapers at 100k and the backfill at 1M.
bench-all:
	$(MAKE) bench BENCH_ARGS="--curve 1,2,4,8,16"
	$(MAKE) bench-ledger BENCH_ARGS=
	$(MAKE) bench-reapers BENCH_ARGS="--items 100000"
	$(MAKE) bench-backfill BENCH_ARGS="--operations 1000000"

# Statements, WAL and backend CPU per fenced transition against pgbench's tpcb-like transaction,
# on a throwaway PostgreSQL of the benchmark's own (pg_stat_statements loaded): the figures the
# load on the machine does not change. BENCH_ARGS="--database-url URL" uses a running server.
bench-server:
	@.ci/bootstrap
	.venv/bin/python tests/bench/server_side.py $(BENCH_ARGS)

bench-ledger:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/ledger_verifier.py $(BENCH_ARGS)

bench-console:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_SCALE) .venv/bin/python tests/bench/console_pages.py $(BENCH_ARGS)

bench-reapers:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/reapers.py $(BENCH_ARGS)

bench-reconcilers:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/reconcilers.py $(BENCH_ARGS)

bench-backfill:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/backfill.py $(BENCH_ARGS)

bench-contention:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/contention.py $(BENCH_ARGS)

# The MCP gateway (fenceline-mcp) against direct MCP calls to the same sandbox upstream, at N = 1
# and 4 sessions, with the app served by gunicorn as make serve serves it (console/gunicorn_conf.py).
bench-gateway:
	@.ci/bootstrap
	DATABASE_URL=$(DATABASE_URL_TEST) .venv/bin/python tests/bench/gateway.py $(BENCH_ARGS)
