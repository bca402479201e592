# The feature model takes the name the product is specified with. RenameModel renames
# the table (missions_feature -> missions_missionfeature) and every reference to it in
# place: no row is copied or dropped. `migrate` renames the content type with it; the
# permissions are renamed here, so users and groups keep what they were granted
# (tests/missions/test_rename_migration.py).
from django.db import migrations

ACTIONS = ("add", "change", "delete", "view")


def _rename_permissions(apps, old: str, new: str, new_name: str) -> None:
    Permission = apps.get_model("auth", "Permission")
    for action in ACTIONS:
        for perm in Permission.objects.filter(content_type__app_label="missions", codename=f"{action}_{old}"):
            twin = Permission.objects.filter(content_type=perm.content_type, codename=f"{action}_{new}").first()
            if twin is None:
                perm.codename, perm.name = f"{action}_{new}", f"Can {action} {new_name}"
                perm.save(update_fields=["codename", "name"])
            else:  # created meanwhile: it takes over the grants of the old one
                twin.user_set.add(*perm.user_set.all())
                twin.group_set.add(*perm.group_set.all())
                perm.delete()


def forwards(apps, schema_editor):
    _rename_permissions(apps, "feature", "missionfeature", "mission feature")


def backwards(apps, schema_editor):
    _rename_permissions(apps, "missionfeature", "feature", "feature")


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("missions", "0004_truth_fields"),
        ("validation", "0004_truth_fields"),
    ]

    operations = [
        migrations.RenameModel(old_name="Feature", new_name="MissionFeature"),
        migrations.RunPython(forwards, backwards),
    ]
