"""Databases made while this app's label was `tasks`: its tables, migration records and
content types move to the label `dynamic_batching`, with every row kept.

Django computes `migrate`'s plan from the migration records before any hook of ours
runs, so the move cannot happen inside a migration: `manage.py batching_relabel` does
it (make run and the containers run it before `migrate`), and until it has run the
system check `batching.E010` stops `migrate` and says so.
"""

from __future__ import annotations

from django.apps import apps
from django.db import connections

OLD_LABEL = "tasks"
LABEL = "dynamic_batching"


def _renames(tables: set[str]) -> list[tuple[str, str]]:
    """(old table, new table) for each of our models still under the old label."""
    pairs = []
    for model in apps.get_app_config(LABEL).get_models(include_auto_created=True):
        new = model._meta.db_table
        old = OLD_LABEL + new.removeprefix(LABEL)
        if old in tables and new not in tables:
            pairs.append((old, new))
    return pairs


def pending(using: str = "default") -> list[tuple[str, str]]:
    """The tables still to move, or [] (a fresh database, or one already moved). A table
    called `tasks_...` that is not ours is left alone: only our migrations' records
    under the old label mark a database as one of ours."""
    connection = connections[using]
    tables = set(connection.introspection.table_names())
    if "django_migrations" not in tables:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM django_migrations WHERE app = %s AND name = %s", [OLD_LABEL, "0001_initial"]
        )
        (ours,) = cursor.fetchone()
    return _renames(tables) if ours else []


def relabel(using: str = "default") -> list[tuple[str, str]]:
    """Move every table, migration record and content type from the old label to ours,
    in one transaction. Returns the tables moved."""
    moved = pending(using)
    if not moved:
        return []
    connection = connections[using]
    models = [m._meta.model_name for m in apps.get_app_config(LABEL).get_models()]
    # One transaction where the database has transactional DDL (PostgreSQL, SQLite); the
    # schema editor opens it (SQLite refuses one opened around it). django_content_type
    # exists wherever contenttypes is installed; where it is not, there is nothing to move.
    with connection.schema_editor(atomic=True) as editor:
        for old, new in moved:
            editor.alter_db_table(None, old, new)
        editor.execute("UPDATE django_migrations SET app = %s WHERE app = %s", [LABEL, OLD_LABEL])
        if apps.is_installed("django.contrib.contenttypes"):
            marks = ", ".join(["%s"] * len(models))
            editor.execute(
                f"UPDATE django_content_type SET app_label = %s WHERE app_label = %s AND model IN ({marks})",
                [LABEL, OLD_LABEL, *models],
            )
    return moved
