from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dedup_jobs', '0009_lock_chain'),
    ]

    operations = [
        migrations.AddField(
            model_name='joblock',
            name='cancel',
            field=models.TextField(blank=True, editable=False, null=True),
        ),
    ]
