"""Pre-built SQL for the hot path's writes and reads, on PostgreSQL.

The ORM compiles every queryset anew; on the fenced path that compiling cost more CPU than
PostgreSQL spent running the statements (docs/performance.md, "Where the time goes"). The
statements here are written once per shape from the models' own metadata (tables, columns),
kept per process, and sent with parameters prepared by the model fields themselves
(``Field.get_db_prep_save``), so a row written here is the row ``Model.save`` would write.

:func:`get`, :func:`update` and :func:`insert` answer as their ORM counterparts do; on
the embedded SQLite default, or given a value that is an expression (``F()``, a database
default), they are those counterparts.
"""

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from django.db import IntegrityError, connection, models, transaction

type Row = tuple[Any, ...]


def plain(values: Iterable[object]) -> bool:
    """Whether every value is a value, not an expression the ORM must compile."""
    return not any(hasattr(value, "resolve_expression") for value in values)


@cache
def _fields(model: type[models.Model]) -> dict[str, models.Field]:
    """Concrete fields by attname (``run_id``) and by name (``run``)."""
    fields: dict[str, models.Field] = {}
    for field in model._meta.concrete_fields:
        fields[field.attname] = field
        fields[field.name] = field
    return fields


def _column(model: type[models.Model], name: str) -> str:
    column = _fields(model)[name].column
    if column is None:  # a concrete field always has one
        raise AssertionError(f"{model.__name__}.{name} has no column")
    return connection.ops.quote_name(column)


def attname(model: type[models.Model], name: str) -> str:
    return _fields(model)[name].attname


def prep(model: type[models.Model], name: str, value: object) -> Any:
    """``value`` as the field ``name`` of ``model`` sends it to the database (a related
    object stands for its primary key)."""
    field = _fields(model)[name]
    if isinstance(value, models.Model):
        value = value.pk
    return field.get_db_prep_save(value, connection)


@cache
def insert_sql(model: type[models.Model], names: tuple[str, ...], rows: int, conflict: tuple[str, ...] = ()) -> str:
    """``INSERT`` of ``rows`` rows of ``names``; with ``conflict``, a row that would break the
    unique key on those columns is skipped (``ON CONFLICT ... DO NOTHING``)."""
    row = f"({', '.join(['%s'] * len(names))})"
    # Table and column names come from the model; every value is a parameter.
    sql = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} "  # noqa: S608
        f"({', '.join(_column(model, name) for name in names)}) VALUES {', '.join([row] * rows)}"
    )
    if conflict:
        sql += f" ON CONFLICT ({', '.join(_column(model, name) for name in conflict)}) DO NOTHING"
    return sql


@cache
def update_sql(model: type[models.Model], assigned: tuple[str, ...], where: tuple[str, ...]) -> str:
    """``UPDATE`` of the columns ``assigned`` on the rows whose ``where`` columns equal the
    parameters that follow the assigned values."""
    return (
        f"UPDATE {connection.ops.quote_name(model._meta.db_table)} "  # noqa: S608 - names from the model
        f"SET {', '.join(f'{_column(model, name)} = %s' for name in assigned)} "
        f"WHERE {' AND '.join(f'{_column(model, name)} = %s' for name in where)}"
    )


@cache
def select_sql(model: type[models.Model], where: tuple[str, ...], related: tuple[str, ...] = ()) -> tuple[str, int]:
    """``SELECT`` of every concrete column of ``model`` (and of the models its foreign keys
    ``related`` point to, by LEFT JOIN) where the ``where`` columns equal the parameters.
    Returns the SQL and the number of the model's own columns."""
    qn = connection.ops.quote_name
    own = [f"t.{_column(model, f.attname)}" for f in model._meta.concrete_fields]
    joins, columns = [], list(own)
    for index, name in enumerate(related):
        target = _related_model(model, name)
        alias = f"j{index}"
        columns += [f"{alias}.{_column(target, f.attname)}" for f in target._meta.concrete_fields]
        joins.append(f"LEFT JOIN {qn(target._meta.db_table)} {alias} ON {alias}.{qn('id')} = t.{_column(model, name)}")
    sql = (
        f"SELECT {', '.join(columns)} FROM {qn(model._meta.db_table)} t {' '.join(joins)} "  # noqa: S608
        f"WHERE {' AND '.join(f't.{_column(model, name)} = %s' for name in where)}"
    )
    return sql, len(own)


def _related_model(model: type[models.Model], name: str) -> type[models.Model]:
    target = _fields(model)[name].related_model
    if not isinstance(target, type) or not issubclass(target, models.Model):
        raise AssertionError(f"{model.__name__}.{name} is not a foreign key")
    return target


def get(model: type[models.Model], related: tuple[str, ...] = (), **where: object) -> models.Model | None:
    """The one row of ``model`` matching ``where`` (by equality), as a model instance with
    the objects of its foreign keys ``related`` attached, as ``select_related`` would; or
    None."""
    if connection.vendor != "postgresql":
        return model._default_manager.select_related(*related).filter(**where).first()
    names = tuple(where)
    sql, own = select_sql(model, names, related)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep(model, name, where[name]) for name in names])
        row = cursor.fetchone()
    if row is None:
        return None
    instance = from_row(model, row[:own])
    offset = own
    for name in related:
        target = _related_model(model, name)
        width = len(target._meta.concrete_fields)
        part = row[offset : offset + width]
        offset += width
        target_object = from_row(target, part) if part[0] is not None else None
        _fields(model)[name].set_cached_value(instance, target_object)  # type: ignore[attr-defined]
    return instance


@cache
def _attnames(model: type[models.Model]) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields]


@cache
def _converters(model: type[models.Model]) -> list[tuple[int, models.Field, list[Any]]]:
    """The columns whose database value a field converts (JSON, for one), with converters."""
    found = []
    for index, field in enumerate(model._meta.concrete_fields):
        converters = field.get_db_converters(connection)
        if converters:
            found.append((index, field, converters))
    return found


def from_row[M: models.Model](model: type[M], row: Sequence[object]) -> M:
    """A model instance from a row of all its concrete columns, in their order, converted
    as the ORM converts them."""
    values = list(row)
    for index, field, converters in _converters(model):
        for converter in converters:
            values[index] = converter(values[index], field, connection)
    return model.from_db(connection.alias, _attnames(model), values)


def update(model: type[models.Model], values: dict[str, object], **where: object) -> int:
    """``UPDATE`` ``model`` set ``values`` where every ``where`` column equals its value;
    the number of rows changed."""
    if connection.vendor != "postgresql" or not plain(values.values()):
        return model._default_manager.filter(**where).update(**values)
    assigned, keys = tuple(values), tuple(where)
    params: list[Any] = [prep(model, name, values[name]) for name in assigned] + [
        prep(model, name, where[name]) for name in keys
    ]
    with connection.cursor() as cursor:
        cursor.execute(update_sql(model, assigned, keys), params)
        return cursor.rowcount


def insert(instance: models.Model, *, conflict: tuple[str, ...] = ()) -> bool:
    """Insert ``instance`` as ``save(force_insert=True)`` would (``auto_now_add`` and
    ``auto_now`` applied); with ``conflict``, skipped when a row holds the same values of
    that unique key. Whether it was inserted. Every field must carry a plain value."""
    model = type(instance)
    fields = model._meta.concrete_fields
    if connection.vendor != "postgresql":
        try:
            with transaction.atomic():
                instance.save(force_insert=True)
        except IntegrityError:
            if not conflict:
                raise
            return False
        return True
    values = [field.pre_save(instance, True) for field in fields]
    if not plain(values):
        raise AssertionError(f"{model.__name__}: expressions are the ORM's to write")
    params: list[Any] = [field.get_db_prep_save(v, connection) for field, v in zip(fields, values, strict=True)]
    with connection.cursor() as cursor:
        cursor.execute(insert_sql(model, tuple(_attnames(model)), 1, conflict), params)
        inserted = cursor.rowcount == 1
    if inserted:
        instance._state.adding = False
        instance._state.db = connection.alias
    return inserted
