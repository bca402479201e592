from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("missions", "0006_repository"),
    ]

    operations = [
        # The `command` executor's lease (missions/services/executor.py).
        migrations.AddField(
            model_name="task",
            name="executor_attempts",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name="task",
            name="claim_token",
            field=models.CharField(blank=True, default="", editable=False, max_length=32),
        ),
        migrations.AddField(
            model_name="task",
            name="claimed_by",
            field=models.CharField(blank=True, default="", editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name="task",
            name="lease_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
