"""Steps may be ``rewound``: undone by an operator's retry from an earlier step
(``stateguard.rewind``), then run again under another id; no longer part of the run's saga."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sagas', '0019_step_kind'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='step',
            name='sagas_step_status_valid',
        ),
        migrations.AlterField(
            model_name='step',
            name='status',
            field=models.CharField(choices=[('started', 'Started'), ('paused', 'Paused'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('violated', 'Violated'), ('rewound', 'Rewound')], default='started', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='step',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['started', 'paused', 'succeeded', 'failed', 'violated', 'rewound'])), name='sagas_step_status_valid'),
        ),
    ]
