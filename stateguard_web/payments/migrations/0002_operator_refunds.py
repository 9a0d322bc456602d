"""Operators may refund by hand: the operator role (accounts' migration 0002 made the group)
gets payments.refund_effect. Superusers have it anyway.

Django creates permissions after all migrations have run (post_migrate), so this one makes the
ones it needs first, as accounts' 0002 does. A database without the operator group (a site
that removed it) is left without it: the role is made again, with this permission, by
``accounts.services`` from ``accounts.roles.ROLES`` when it is next granted.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLE, CODENAME = "operator", "refund_effect"


def grant(apps, schema_editor):
    payments = apps.get_app_config("payments")
    payments.models_module = True  # create_permissions skips an app without models
    create_permissions(payments, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    payments.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name=ROLE).first()
    if group is not None:
        group.permissions.add(Permission.objects.get(content_type__app_label="payments",
                                                     codename=CODENAME))


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group = Group.objects.filter(name=ROLE).first()
    perm = Permission.objects.filter(content_type__app_label="payments", codename=CODENAME).first()
    if group is not None and perm is not None:
        group.permissions.remove(perm)


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0001_initial"),
        ("accounts", "0002_roles"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
