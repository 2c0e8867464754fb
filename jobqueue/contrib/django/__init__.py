"""Django integration: ``INSTALLED_APPS = [..., "jobqueue.contrib.django"]``.

- ``JOBQUEUE = {"APP": "shop.tasks:app", "DATABASE": "default"}`` (both optional) names the
  JobQueue and the Django database it uses.
- ``python manage.py migrate`` creates the jobqueue tables (a migration equal to ``jobqueue db init``).
- ``python manage.py jobqueue <command>`` runs any ``jobqueue`` CLI command on that app and database.
- A ``JobQueue()`` made without a URL uses the configured Django database, and ``.delay()`` inside
  ``transaction.atomic()`` writes through Django's connection: a rollback leaves no job.
- ``jobqueue.contrib.django.backend.JobQueueBackend`` runs tasks written for Django's task API
  (``django.tasks``, or the ``django-tasks`` backport) on jobqueue workers. Only this backend
  needs that API; the rest works with Django alone.
- With ``django.contrib.admin`` installed, the admin lists active and archived jobs (read-only)
  and retries or cancels them (``admin.py``, over the unmanaged models of ``models.py``).
"""
