"""Settings of the demo and test project.

The database comes from ``DATABASE_URL``; without one, an embedded PostgreSQL is started (see
``databases.py``).
"""

import json
from pathlib import Path

import environ

from testproject.databases import database_url

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = "django-eddyq-testproject-not-secret"
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_eddyq",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": environ.Env.db_url_config(database_url())}
# A second database for the jobs, as a project with EDDYQ["DATABASE"] = "queue" has it.
if env("QUEUE_DATABASE_URL", default=""):
    DATABASES["queue"] = environ.Env.db_url_config(env("QUEUE_DATABASE_URL"))

# Django's default CONN_MAX_AGE of 0, which django_eddyq.W004 advises against: the tests run
# workers inside the test process, whose handler threads must not leave connections open past a
# test, and the benchmarks measure what Django's default costs (benchmarks/connections.py).
# DATABASE_URL's ?conn_max_age=600 keeps them (tests/faults/ does, for its workers).
SILENCED_SYSTEM_CHECKS = ["django_eddyq.W004"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

EDDYQ: dict[str, object] = {}

# Tests of `manage.py eddyq periodic` give their subprocess schedules: EDDYQ["PERIODIC"] as JSON.
if env("TESTPROJECT_PERIODIC", default=""):
    EDDYQ["PERIODIC"] = json.loads(env("TESTPROJECT_PERIODIC"))

# Tests and benchmarks trace a worker process with this (testproject/otel.py).
if env("TESTPROJECT_OTEL", default=""):
    from testproject.otel import configure as configure_tracing

    configure_tracing(env("TESTPROJECT_OTEL"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_eddyq": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="INFO")}
    },
}
