from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("missions", "0005_rename_feature_missionfeature"),
    ]

    operations = [
        # A rename keeps every mission's path as it was (docs/REPOSITORIES.md).
        migrations.RenameField(model_name="mission", old_name="workspace", new_name="repository"),
        migrations.AlterField(
            model_name="mission",
            name="repository",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Git URL (https://, ssh://, git://, file://, user@host:path) or local path of the repository.",
                max_length=500,
            ),
        ),
        migrations.AddField(
            model_name="mission",
            name="credentials_env",
            field=models.CharField(
                blank=True,
                default="",
                help_text="Name of the environment variable, on the workers, holding an HTTPS token or an ssh key path.",
                max_length=100,
            ),
        ),
    ]
