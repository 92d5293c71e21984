import os

from django.core.wsgi import get_wsgi_application

from ledger.observability.tracing import setup_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
setup_tracing()  # spans when OTEL_EXPORTER_OTLP_ENDPOINT is set; before the middleware loads
application = get_wsgi_application()
