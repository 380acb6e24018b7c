"""Storage parameters for the message table on PostgreSQL.

Every message is inserted once and updated a few times before it is pruned:
the table churns. PostgreSQL's default autovacuum thresholds (20 % dead rows)
let a large table gather millions of dead tuples between runs, which bloats
the claim index; free room on each page lets the claim and acknowledgement
updates stay on their page (HOT). Other databases are left as they are.
"""

from django.db import migrations

PARAMETERS = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_insert_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


def _alter(apps, schema_editor, reset: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_delayq", "Message")._meta.db_table)
    if reset:
        schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(PARAMETERS)})")
    else:
        options = ", ".join(f"{name} = {value}" for name, value in PARAMETERS.items())
        schema_editor.execute(f"ALTER TABLE {table} SET ({options})")


def set_parameters(apps, schema_editor):
    _alter(apps, schema_editor, reset=False)


def reset_parameters(apps, schema_editor):
    _alter(apps, schema_editor, reset=True)


class Migration(migrations.Migration):
    dependencies = [("django_delayq", "0004_worker_state")]

    operations = [migrations.RunPython(set_parameters, reset_parameters, elidable=False)]
