"""Customers, labs and lab days, bookings, and the cluster configurations customers submit."""
