"""ledger/prepared.py: the hot path's pre-built statements."""

import psycopg._queries

from ledger import prepared


def test_psycopg_keeps_the_placeholder_conversion_of_the_hot_paths_larger_statements():
    """psycopg parses a statement's placeholders on every execution once it has more than 50
    parameters or 4,096 characters; an intent's one statement has 62. prepared raises both
    limits: should a psycopg upgrade rename them, this fails instead of the hot path
    silently parsing again."""
    assert psycopg._queries.MAX_CACHED_STATEMENT_PARAMS >= prepared._CACHEABLE_PARAMS
    assert psycopg._queries.MAX_CACHED_STATEMENT_LENGTH >= prepared._CACHEABLE_LENGTH
    query = psycopg._queries.PostgresQuery(psycopg.adapt.Transformer())
    statement = "SELECT " + ", ".join(["%s::int"] * 62)
    before = psycopg._queries._query2pg.cache_info().hits
    for _ in range(2):
        query.convert(statement, list(range(62)))
    assert psycopg._queries._query2pg.cache_info().hits == before + 1
