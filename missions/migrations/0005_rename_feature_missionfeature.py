# The feature model takes the name the product is specified with. RenameModel renames
# the table (missions_feature -> missions_missionfeature) and every reference to it in
# place: no row is copied or dropped (tests/missions/test_rename_migration.py).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("missions", "0004_truth_fields"),
        ("validation", "0004_truth_fields"),
    ]

    operations = [
        migrations.RenameModel(old_name="Feature", new_name="MissionFeature"),
    ]
