"""Django settings (minimal placeholder until the platform core lands)."""

SECRET_KEY = "dev-only-not-secret"  # noqa: S105
INSTALLED_APPS: list[str] = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
