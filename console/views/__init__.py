"""Operator console views, one module per area. Views are thin: they read through
user-scoped selectors (``get_object_or_404`` on a restricted queryset, so another tenant's
object is a 404) and change state only by calling a service."""
