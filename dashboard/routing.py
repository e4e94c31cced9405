"""Websocket routes: one live socket per open dashboard screen; any other path is refused."""

from channels.security.websocket import WebsocketDenier
from django.urls import URLPattern, path, re_path

from dashboard.consumers import LiveConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/live/", LiveConsumer.as_asgi()),  # type: ignore[arg-type]
    # Last, matching any path: channels' router raises for a path it has no route for (a
    # traceback logged at ERROR for each such handshake, anyone's); refused as HTTP 403 instead.
    re_path(r"", WebsocketDenier.as_asgi()),  # type: ignore[arg-type]
]
