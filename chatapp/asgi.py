"""The ASGI application, served by Daphne: HTTP through Django, WebSockets through Channels.

Django is set up first (``get_asgi_application``) so that the consumer's imports may use models.
Sockets pass the origin checks (the Origin's host is in ``ALLOWED_HOSTS``, and the Origin is this
site itself or a trusted origin: :mod:`chatapp.realtime.origin`), then the session and auth middleware
(which put ``session`` and ``user`` in the scope), then the router. With ``SERVE_STATIC`` (the embedded
default) static files are served by Django itself, since a single Daphne process has no proxy in
front of it; a production proxy serves ``STATIC_ROOT`` instead.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from chatapp.realtime.origin import SameOriginValidator  # noqa: E402
from chatapp.routing import websocket_urlpatterns  # noqa: E402
from memory.api import get_counter  # noqa: E402

# Load the chat model's token encoding now (a few hundred milliseconds of CPU holding the GIL)
# rather than in the first turn, where it stalled every socket of the worker.
get_counter(settings.LLM_CHAT_MODEL)

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)
