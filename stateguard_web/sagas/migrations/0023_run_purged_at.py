"""Retention (runs/retention.py): ``Run.purged_at``, set when a run's steps and checkpoints were
deleted and its thin row kept for the ledger, and two partial indexes to find what to purge
without reading what was purged. A nullable column with no default: adding it rewrites no row.
The indexes are built with a plain CREATE INDEX (SQLite runs this migration too): writes to
``sagas_run`` wait while they are built (docs/deploy.md, Retention)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sagas', '0022_run_incident'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='purged_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('purged_at__isnull', True)),
                               fields=['status', 'created_at'], name='sagas_run_retention'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('purged_at__isnull', False)),
                               fields=['created_at'], name='sagas_run_purged'),
        ),
    ]
