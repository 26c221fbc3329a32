"""The site as an ASGI application, and the gunicorn worker that serves it.

Why uvicorn workers under gunicorn (not daphne): gunicorn stays the process manager it
was under WSGI (worker restarts, --timeout, graceful shutdown, the same command line and
--forwarded-allow-ips), and each worker runs one uvicorn event loop. Async views (a
request's status with `?wait=`, tasks/web/api.py) then wait on their answers as
coroutines on that loop, with no thread each; the site's sync views run as Django runs
them under ASGI, each on a thread of its own for its duration. Daphne would bring
Twisted for WebSockets the site does not have. The worker class is
batching_site/web_worker.py.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
application = get_asgi_application()
