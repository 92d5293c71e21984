"""Delivery evidence of effects, apart from their execution (docs/api.md, "Delivery evidence")."""
