"""The version of its agent each run was submitted on (``Run.agent_version``,
``Run.graph_digest``) and the shape of each version's graph (``AgentVersion``): a worker goes
on with a run only on the version it started on (runs/versions.py).

The columns are nullable with no default: adding them rewrites no row on PostgreSQL and does
not rebuild ``sagas_run`` on SQLite (which would drop its triggers, see 0012). Runs submitted
before have NULL, and go on as they did.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sagas', '0025_map_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='agent_version',
            field=models.CharField(blank=True, editable=False, max_length=100, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='graph_digest',
            field=models.CharField(blank=True, editable=False, max_length=16, null=True),
        ),
        migrations.CreateModel(
            name='AgentVersion',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent', models.CharField(max_length=100)),
                ('version', models.CharField(blank=True, max_length=100)),
                ('graph_digest', models.CharField(max_length=16)),
                ('nodes', models.JSONField()),
                ('edges', models.JSONField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('agent', 'version', 'graph_digest'), name='sagas_agentversion_unique')],
            },
        ),
    ]
