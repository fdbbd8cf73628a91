"""Settings for mypy's Django plugin: the apps, and a database that is never connected to."""

SECRET_KEY = "mypy"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_eddyq",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}}
USE_TZ = True
