"""On MySQL and MariaDB, the lock and debounce keys compare byte for byte.

Their default collations fold case and accents (utf8mb4_general_ci, utf8mb4_0900_ai_ci) and
ignore trailing spaces (PAD SPACE), so the unique ``key`` column would merge the locks of ids
such as "Item" and "item". The keys become binary, NO PAD, as on every other store. Other
databases compare bytes already: nothing to do there.
"""

from django.db import migrations


def binary_keys(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    if connection.mysql_is_mariadb:
        collation = "utf8mb4_nopad_bin"  # MariaDB 10.2+
    elif connection.mysql_version >= (8, 0, 17):
        collation = "utf8mb4_0900_bin"
    else:
        collation = "utf8mb4_bin"
    for model in ("JobLock", "PendingDebounce"):
        table = apps.get_model("dedup_jobs", model)._meta.db_table
        schema_editor.execute(
            f"ALTER TABLE {schema_editor.quote_name(table)} MODIFY {schema_editor.quote_name('key')}"
            f" varchar(512) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("dedup_jobs", "0003_admin_pages"),
    ]

    operations = [
        migrations.RunPython(binary_keys, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
