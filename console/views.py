"""Operator console views. Thin: they read through selectors and call services."""

from django.shortcuts import render


def home(request):
    return render(request, "console/home.html")
