"""Websocket routes: one live socket per open dashboard screen."""

from django.urls import URLPattern, path

from dashboard.consumers import LiveConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/live/", LiveConsumer.as_asgi()),  # type: ignore[arg-type]
]
