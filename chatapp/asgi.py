"""The ASGI application: HTTP through Django (static files too with ``SERVE_STATIC``, ServeStatic's middleware),
WebSockets through Channels
behind the origin checks (:mod:`chatapp.realtime.origin`) and the session and auth middleware."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from chatapp.realtime.origin import SameOriginValidator  # noqa: E402
from chatapp.routing import websocket_urlpatterns  # noqa: E402
from memory.api import get_counter  # noqa: E402

# Load the token encoding now (CPU holding the GIL), not in the first turn where it stalled the worker's sockets.
get_counter(settings.LLM_CHAT_MODEL)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)
