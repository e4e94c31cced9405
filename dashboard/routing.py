"""Websocket routes (the live dashboard adds its consumer here)."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
