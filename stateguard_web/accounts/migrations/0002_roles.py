"""The roles: groups viewer, submitter and operator, with the journal's permissions.

Django creates permissions after all migrations have run (post_migrate), so this one makes the
ones it needs first. Reversing removes the groups (not the permissions, which belong to the
models). A copy of ``accounts.roles.ROLES``, frozen as a migration must be.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLES = {
    "viewer": ["sagas.view_run"],
    "submitter": ["sagas.submit_run"],
    "operator": ["sagas.view_run", "sagas.operate_run"],
}


def create_roles(apps, schema_editor):
    sagas = apps.get_app_config("sagas")
    sagas.models_module = True  # create_permissions skips an app without models
    create_permissions(sagas, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    sagas.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, perms in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        for perm in perms:
            app_label, codename = perm.split(".")
            group.permissions.add(Permission.objects.get(content_type__app_label=app_label,
                                                         codename=codename))


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_initial"),
        ("sagas", "0011_run_permissions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
