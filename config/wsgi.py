import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.startup import require_settings  # noqa: E402

require_settings()
application = get_wsgi_application()
