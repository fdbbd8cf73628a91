"""Django settings of the django-tasks-db peer: its app, its backend, its own database."""

import environ

SECRET_KEY = "django-eddyq-benchmarks-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {"default": environ.Env.db_url_config(environ.Env()("DATABASE_URL"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
