"""One model's rows by equality, without the ORM: :func:`get`, :func:`select`,
:func:`insert`, :func:`update`, and the statements behind them, written once per shape from
the model's own metadata and sent with values prepared by the model fields themselves
(``Field.get_db_prep_save``), so a row written here is the row ``Model.save`` would write.

:func:`get`, :func:`update` and :func:`insert` answer as their ORM counterparts do; given a
value that is an expression (``F()``, a database default), :func:`update` is its
counterpart. :func:`from_row` and :func:`loaded` make instances from the rows the other
statements of ``ledger.sql`` read.
"""

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cache
from operator import attrgetter
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, models
from django.db.models.base import ModelState
from psycopg.types.numeric import Int2, Int4, Int8

from ledger.sql.connection import database, execute
from ledger.versioning import known_for, require_known


def plain(values: Iterable[object]) -> bool:
    """Whether every value is a value, not an expression the ORM must compile."""
    return not any(hasattr(value, "resolve_expression") for value in values)


# A concrete field of any model (Django's Field is generic to the type checker only, so the
# alias is evaluated lazily, never at run time).
type AnyField = models.Field[Any, Any]


@cache
def _fields(model: type[models.Model]) -> dict[str, AnyField]:
    """Concrete fields by attname (``run_id``) and by name (``run``)."""
    fields: dict[str, AnyField] = {}
    for field in model._meta.concrete_fields:
        fields[field.attname] = field
        fields[field.name] = field
    return fields


def column(model: type[models.Model], name: str) -> str:
    """The column of ``model``'s concrete field ``name`` (or attname)."""
    found = _fields(model)[name].column
    if found is None:  # a concrete field always has one
        raise AssertionError(f"{model.__name__}.{name} has no column")
    return found


def _column(model: type[models.Model], name: str) -> str:
    return connection.ops.quote_name(column(model, name))


def attnames(model: type[models.Model]) -> tuple[str, ...]:
    """The attnames of ``model``'s concrete fields, in column order."""
    return tuple(_attnames(model))


def attname(model: type[models.Model], name: str) -> str:
    return _fields(model)[name].attname


def prep(model: type[models.Model], name: str, value: object) -> Any:
    """``value`` as the field ``name`` of ``model`` sends it to the database (a related
    object stands for its primary key): what ``Field.get_db_prep_save`` gives, for the
    common types without its detours."""
    return _prepper(model, name)(value)


def params(model: type[models.Model], names: tuple[str, ...], instance: models.Model) -> list[Any]:
    """The values of ``instance``'s fields ``names`` (attnames), as :func:`prep` sends them."""
    preppers, read = _preppers(model, names)
    values = read(instance)
    if len(names) == 1:
        values = (values,)
    return [prep(value) for prep, value in zip(preppers, values, strict=True)]


@cache
def _preppers(
    model: type[models.Model], names: tuple[str, ...]
) -> tuple[tuple[Callable[[object], Any], ...], Callable[[object], Any]]:
    return tuple(_prepper(model, name) for name in names), attrgetter(*names)


_INTEGERS = {
    "SmallIntegerField": Int2,
    "IntegerField": Int4,
    "BigIntegerField": Int8,
    "PositiveSmallIntegerField": Int2,
    "PositiveIntegerField": Int4,
    "PositiveBigIntegerField": Int8,
}


@cache
def _prepper(model: type[models.Model], name: str) -> Callable[[object], Any]:
    field = _fields(model)[name]

    def slow(value: object) -> Any:
        if isinstance(value, models.Model):
            value = value.pk
        return field.get_db_prep_save(value, database())

    target = field.target_field if isinstance(field, models.ForeignKey) else field
    kind = target.get_internal_type()
    if kind in ("CharField", "TextField"):
        return lambda value: value if value is None or type(value) is str else slow(value)
    if kind == "UUIDField":
        return lambda value: value if value is None or type(value) is uuid.UUID else slow(value)
    if kind == "DateTimeField":
        return lambda value: (
            value if value is None or (type(value) is datetime and value.tzinfo is not None) else slow(value)
        )
    if kind in _INTEGERS:
        wrap = _INTEGERS[kind]
        return lambda value: None if value is None else wrap(value) if type(value) is int else slow(value)
    return slow


@cache
def insert_sql(model: type[models.Model], names: tuple[str, ...], rows: int, conflict: tuple[str, ...] = ()) -> str:
    """``INSERT`` of ``rows`` rows of ``names``; with ``conflict``, a row that would break the
    unique key on those columns is skipped (``ON CONFLICT ... DO NOTHING``)."""
    row = f"({', '.join(['%s'] * len(names))})"
    # Table and column names come from the model; every value is a parameter.
    sql = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} "
        f"({', '.join(_column(model, name) for name in names)}) VALUES {', '.join([row] * rows)}"
    )
    if conflict == ANY_KEY:
        sql += " ON CONFLICT DO NOTHING"
    elif conflict:
        sql += f" ON CONFLICT ({', '.join(_column(model, name) for name in conflict)}) DO NOTHING"
    return sql


# ``conflict=ANY_KEY``: skip the row on a conflict with any unique key (a partial unique
# index cannot be named by its columns alone).
ANY_KEY = ("*",)


@cache
def update_sql(model: type[models.Model], assigned: tuple[str, ...], where: tuple[str, ...]) -> str:
    """``UPDATE`` of the columns ``assigned`` on the rows whose ``where`` columns equal the
    parameters that follow the assigned values."""
    return (
        f"UPDATE {connection.ops.quote_name(model._meta.db_table)} "
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
        f"SELECT {', '.join(columns)} FROM {qn(model._meta.db_table)} t {' '.join(joins)} "
        f"WHERE {' AND '.join(f't.{_column(model, name)} = %s' for name in where)}"
    )
    return sql, len(own)


def _related_model(model: type[models.Model], name: str) -> type[models.Model]:
    target = _fields(model)[name].related_model
    if not isinstance(target, type) or not issubclass(target, models.Model):
        raise AssertionError(f"{model.__name__}.{name} is not a foreign key")
    return target


def get[M: models.Model](model: type[M], related: tuple[str, ...] = (), **where: object) -> M | None:
    """The one row of ``model`` matching ``where`` (by equality), as a model instance with
    the objects of its foreign keys ``related`` attached, as ``select_related`` would; or
    None."""
    names = tuple(where)
    sql, own = select_sql(model, names, related)
    row = execute(sql, [prep(model, name, where[name]) for name in names]).fetchone()
    return None if row is None else _with_related(model, related, row, own)


def select[M: models.Model](model: type[M], related: tuple[str, ...] = (), **where: object) -> list[M]:
    """Every row of ``model`` matching ``where`` (by equality), in no particular order, as
    :func:`get` makes each: ``list(filter(**where))`` without the ORM compiling it."""
    names = tuple(where)
    sql, own = select_sql(model, names, related)
    rows = execute(sql, [prep(model, name, where[name]) for name in names]).fetchall()
    return [_with_related(model, related, row, own) for row in rows]


def _with_related[M: models.Model](model: type[M], related: tuple[str, ...], row: Sequence[object], own: int) -> M:
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
def _converters(model: type[models.Model]) -> list[tuple[int, AnyField, list[Any]]]:
    """The columns whose database value a field converts (JSON, for one), with converters."""
    found = []
    for index, field in enumerate(model._meta.concrete_fields):
        converters = field.get_db_converters(connection)
        if converters:
            found.append((index, field, converters))
    return found


def unsaved[M: models.Model](model: type[M], **values: object) -> M:
    """A new, unsaved instance of ``model`` with every concrete field given by attname, as
    ``model(**values)`` would make it, without ``__init__``'s field-by-field work."""
    instance = model.__new__(model)
    if values.keys() != _attname_set(model):
        raise TypeError(f"{model.__name__}: give exactly its fields {sorted(_attname_set(model))}")
    instance.__dict__.update(values)
    instance._state = ModelState()
    return instance


@cache
def _attname_set(model: type[models.Model]) -> frozenset[str]:
    return frozenset(_attnames(model))


def from_row[M: models.Model](model: type[M], row: Sequence[object]) -> M:
    """A model instance from a row of all its concrete columns, in their order, converted
    as the ORM converts them: what ``Model.from_db`` builds (the schema version checked),
    without running ``__init__`` field by field (no model here has init signals)."""
    values = list(row)
    for index, field, converters in _converters(model):
        for converter in converters:
            values[index] = converter(values[index], field, database())
    instance = model.__new__(model)
    instance.__dict__.update(zip(_attnames(model), values, strict=True))
    state = instance._state = ModelState()
    state.adding, state.db = False, DEFAULT_DB_ALIAS
    if "schema_version" in instance.__dict__:
        label = model._meta.label
        require_known(instance.__dict__["schema_version"], f"{label} row", stored=True, known=known_for(label))
    return instance


def loaded[M: models.Model](model: type[M], names: tuple[str, ...], row: Sequence[object]) -> M:
    """An instance of ``model`` as read from the database with the columns ``names`` only
    (their values in ``row``, none needing a conversion); the others are deferred fields,
    loaded on first use as after the ORM's ``only()``. Its schema version is checked, as
    every load checks it."""
    instance = model.__new__(model)
    instance.__dict__.update(zip(names, row, strict=True))
    state = instance._state = ModelState()
    state.adding, state.db = False, DEFAULT_DB_ALIAS
    require_known(instance.__dict__["schema_version"], f"{model._meta.label} row", stored=True)
    return instance


def update(model: type[models.Model], values: dict[str, object], **where: object) -> int:
    """``UPDATE`` ``model`` set ``values`` where every ``where`` column equals its value;
    the number of rows changed."""
    if not plain(values.values()):
        return model._default_manager.filter(**where).update(**values)
    assigned, keys = tuple(values), tuple(where)
    params: list[Any] = [prep(model, name, values[name]) for name in assigned] + [
        prep(model, name, where[name]) for name in keys
    ]
    return execute(update_sql(model, assigned, keys), params).rowcount


def insert_params(instance: models.Model) -> tuple[tuple[str, ...], list[Any]]:
    """The columns (attnames) and parameters of ``instance``'s INSERT, as :func:`insert`
    sends them (a model whose primary key the database generates is not for this)."""
    model = type(instance)
    fields = model._meta.concrete_fields
    values = [field.pre_save(instance, True) for field in fields]
    if not plain(values) or (instance.pk is None and isinstance(model._meta.pk, models.AutoField)):
        raise AssertionError(f"{model.__name__}: not a row of plain values with its key")
    return tuple(_attnames(model)), [prep(model, field.attname, v) for field, v in zip(fields, values, strict=True)]


def insert(instance: models.Model, *, conflict: tuple[str, ...] = ()) -> bool:
    """Insert ``instance`` as ``save(force_insert=True)`` would (``auto_now_add`` and
    ``auto_now`` applied, a generated primary key read back); with ``conflict``, skipped
    when a row holds the same values of that unique key. Whether it was inserted. Every
    field must carry a plain value."""
    model = type(instance)
    generated = instance.pk is None and isinstance(model._meta.pk, models.AutoField)
    fields = [f for f in model._meta.concrete_fields if not (generated and f.primary_key)]
    values = [field.pre_save(instance, True) for field in fields]
    if not plain(values):
        raise AssertionError(f"{model.__name__}: expressions are the ORM's to write")
    params: list[Any] = [prep(model, field.attname, v) for field, v in zip(fields, values, strict=True)]
    sql = insert_sql(model, tuple(f.attname for f in fields), 1, conflict)
    if generated:
        row = execute(f"{sql} RETURNING {_column(model, model._meta.pk.attname)}", params).fetchone()
        if row is None:
            return False
        instance.pk = row[0]
    elif execute(sql, params).rowcount != 1:
        return False
    instance._state.adding = False
    instance._state.db = DEFAULT_DB_ALIAS
    return True
