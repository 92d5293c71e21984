import os

from django.core.asgi import get_asgi_application

from ledger.observability.tracing import setup_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
setup_tracing()  # spans when OTEL_EXPORTER_OTLP_ENDPOINT is set; before the middleware loads
application = get_asgi_application()
