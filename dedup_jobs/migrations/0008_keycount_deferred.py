from django.db import migrations, models


class Migration(migrations.Migration):
    """The Overview's busiest keys count deferrals apart from duplicates prevented."""

    dependencies = [("dedup_jobs", "0007_debounce_previous_payload")]

    operations = [
        migrations.AddField(
            model_name="keycount",
            name="deferred",
            field=models.BigIntegerField(default=0),
        ),
    ]
