import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.startup import require_secret_key  # noqa: E402

require_secret_key()
application = get_wsgi_application()
