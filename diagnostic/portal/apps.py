"""Django app configuration for the customer portal."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "diagnostic.portal"
    label = "portal"
