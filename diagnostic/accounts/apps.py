"""Django app configuration for customer accounts."""

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "diagnostic.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
