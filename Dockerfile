# syntax=docker/dockerfile:1
# The Fenceline image: web (gunicorn), Celery worker and beat, and the one-shot migrate, all
# from one image (compose.yaml; docs/production.md, "Containers (compose.yaml)").
# .ci/deploy_gate.py holds this file to the deployment baseline in CI: every FROM pinned by
# digest, no `latest`, no ADD from a URL, no secret in ENV/ARG or copied in, a non-root USER.
#
# Base image: python:3.13-slim (Django 6 needs Python >= 3.12), pinned by digest. The digest
# below is the one a public project's build log recorded for python:3.13-slim on 2026-09-28
# (there is no registry access where this file was written). Refresh tag and digest together,
# in both FROM lines, with
#   docker buildx imagetools inspect python:3.13-slim      (its "Digest:" line)
# and record the digest of the image you push (`docker buildx build --push --metadata-file ...`,
# key "containerimage.digest") with the release.

# --- build: the project's dependencies (not the dev extras) in a virtualenv ---------------
FROM python:3.13-slim@sha256:7c61056e61ac89e852de05f3dc6fa51a6dd2181797bceed46aa725dd7cb2cd3b AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml ./
COPY clients/python/ clients/python/
COPY console/ console/
COPY ledger/ ledger/
COPY approvals/ approvals/
# The worker side (fenceline-client, which the server imports) and pyproject.toml's
# dependencies, in one pip command so the server's fenceline-client requirement is the copy
# from clients/python; the fenceline package itself is removed again because the code runs
# from /app (settings.BASE_DIR finds templates/ and static/ beside it).
RUN /opt/venv/bin/pip install --no-cache-dir ./clients/python . \
    && /opt/venv/bin/pip uninstall --yes fenceline

# --- runtime ------------------------------------------------------------------------------
FROM python:3.13-slim@sha256:7c61056e61ac89e852de05f3dc6fa51a6dd2181797bceed46aa725dd7cb2cd3b AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FENCELINE_STATE_DIR=/var/cache/fenceline

# uid/gid 10001, no login shell, no home. The directories that compose.yaml mounts volumes on
# are created here owned by 10001, so a new named volume starts out owned by it as well.
RUN groupadd --system --gid 10001 fenceline \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin fenceline \
    && install -d -o 10001 -g 10001 -m 0750 /var/cache/fenceline /var/lib/fenceline /var/lib/fenceline/beat

COPY --from=build /opt/venv /opt/venv

# The code is owned by root and read-only to the process; compiled here because the root
# filesystem is read-only at run time (compose.yaml's read_only: true).
WORKDIR /app
COPY manage.py ./
COPY console/ console/
COPY ledger/ ledger/
COPY approvals/ approvals/
COPY templates/ templates/
COPY static/ static/
RUN python -m compileall -q /app

USER 10001:10001
EXPOSE 8000

# /readyz answers 503 unless the database is migrated, the broker answers and the beat jobs
# are fresh (compose.yaml repeats this check for web and gives worker and beat their own).
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["python", "-m", "console.healthcheck", "http://127.0.0.1:8000/readyz"]

# The server's settings are console/gunicorn_conf.py (threaded workers, bounded client I/O, no
# gunicorn.ctl management socket), as docs/production.md and make serve start it.
CMD ["gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi:application", "--bind", "0.0.0.0:8000"]
