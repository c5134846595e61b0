"""Booking: a per-episode hotel database; the reward reads the bookings left at the end."""
