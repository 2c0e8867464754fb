"""The models the admin shows over the message and archive tables. They are unmanaged: this
migration only tells Django they exist, and creates or changes nothing in the database (0001 and
jobqueue's own migrations make the tables)."""

from django.db import migrations, models

import jobqueue.contrib.django.models


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0005_schema_5"),
    ]

    operations = [
        migrations.CreateModel(
            name="Archive",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("task_name", models.CharField(max_length=255, verbose_name="task")),
                ("queue", models.CharField(max_length=100)),
                ("priority", models.IntegerField()),
                ("attempts_count", models.IntegerField(verbose_name="attempts")),
                ("payload", models.BinaryField()),
                ("unique_key", models.CharField(max_length=255, null=True)),
                ("partition_key", models.CharField(max_length=255, null=True)),
                ("created_at", jobqueue.contrib.django.models.UTCDateTimeField(verbose_name="enqueued at")),
                ("first_attempt_at", jobqueue.contrib.django.models.UTCDateTimeField(null=True)),
                ("last_attempt_at", jobqueue.contrib.django.models.UTCDateTimeField(null=True)),
                (
                    "state",
                    models.CharField(
                        choices=[("COMPLETED", "completed"), ("FAILED", "failed"), ("CANCELLED", "cancelled")],
                        max_length=10,
                    ),
                ),
                ("finished_at", jobqueue.contrib.django.models.UTCDateTimeField(null=True)),
                ("archived_at", jobqueue.contrib.django.models.UTCDateTimeField()),
                ("result", models.BinaryField(null=True)),
                ("error_type", models.CharField(max_length=255, null=True)),
                ("error_message", models.TextField(null=True)),
                ("error_traceback", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "archived job",
                "verbose_name_plural": "archived jobs",
                "db_table": "jobqueue_archive",
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Message",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("task_name", models.CharField(max_length=255, verbose_name="task")),
                ("queue", models.CharField(max_length=100)),
                ("priority", models.IntegerField()),
                ("attempts_count", models.IntegerField(verbose_name="attempts")),
                ("payload", models.BinaryField()),
                ("unique_key", models.CharField(max_length=255, null=True)),
                ("partition_key", models.CharField(max_length=255, null=True)),
                ("created_at", jobqueue.contrib.django.models.UTCDateTimeField(verbose_name="enqueued at")),
                ("first_attempt_at", jobqueue.contrib.django.models.UTCDateTimeField(null=True)),
                ("last_attempt_at", jobqueue.contrib.django.models.UTCDateTimeField(null=True)),
                (
                    "state",
                    models.CharField(
                        choices=[("PENDING", "pending"), ("PROCESSING", "processing"), ("RETRYABLE", "retryable")],
                        max_length=10,
                    ),
                ),
                ("next_attempt_at", jobqueue.contrib.django.models.UTCDateTimeField(verbose_name="next attempt at")),
                ("worker_id", models.CharField(max_length=32, null=True, verbose_name="worker")),
                ("last_error_type", models.CharField(max_length=255, null=True)),
                ("last_error_message", models.TextField(null=True)),
                ("last_error_traceback", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "active job",
                "verbose_name_plural": "active jobs",
                "db_table": "jobqueue_message",
                "managed": False,
            },
        ),
    ]
