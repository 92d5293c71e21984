"""The Celery application. Tasks live in each app's tasks.py; the schedule is in settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("fenceline")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
