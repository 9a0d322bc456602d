"""A lease names its holder's process lock (``sagas.journal.process_lock``): a run whose
holder's process died is recovered at once instead of when its lease runs out. A nullable
column with no default: adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sagas', '0020_step_rewound'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='lease_lock',
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
