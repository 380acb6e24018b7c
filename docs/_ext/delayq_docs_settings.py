"""Django settings for building the documentation (autodoc imports the models).

No database is ever opened: the build only imports modules and reads their
parsers, defaults and docstrings.
"""

SECRET_KEY = "docs-only-not-secret"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_delayq",
]
