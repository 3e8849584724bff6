"""Django app registration for bookings."""

from django.apps import AppConfig


class BookingsConfig(AppConfig):
    name = "diagnostic.bookings"
    label = "bookings"
    verbose_name = "Bookings"
