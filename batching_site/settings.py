"""Django settings for the batching site.

Every secret and every address comes from the environment (or a `.env` file beside
manage.py, which `make run` writes on first start). Nothing here is a credential.
"""

import warnings
from pathlib import Path
from urllib.parse import quote

import environ
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.management.utils import get_random_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

#: DJANGO_READ_DOT_ENV=0 ignores .env: a process configured wholly by its environment
#: (a container, a settings test) must not pick up a developer's local secrets.
if env.bool("DJANGO_READ_DOT_ENV", default=True) and (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

#: Off unless DJANGO_DEBUG=1. `make run` turns it on for local development.
DEBUG = env.bool("DJANGO_DEBUG", default=False)

#: Without DJANGO_SECRET_KEY each process makes up its own key: sessions then do not
#: survive a restart, which is safe, and nobody can ship a known default key.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="") or get_random_secret_key()

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",
    "dynamic_batching",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Failed logins limited per address and per username, before the password is
    # checked, and first: a flood of refused logins costs as little as it can.
    "batching_site.logins.LoginThrottle",
    # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    "batching_site.static.StaticFiles",  # WhiteNoise, async-capable
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "batching_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "batching_site.wsgi.application"
ASGI_APPLICATION = "batching_site.asgi.application"

#: SQLite beside manage.py unless DATABASE_URL names another database (postgres://...).
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}

# --- Celery and batching --------------------------------------------------------------
# This site is a host project of the batching package like any other: its Celery
# settings are its own, and batching reads its settings from the BATCHING dict (each key
# overridable by BATCHING_<KEY> in the environment: docs/configuration.md).

#: One Redis (or Valkey) serves as broker, result backend and batching's store. `make
#: run` finds or starts one at this address; tests start their own on a free port.
#: Without REDIS_URL: the Redis `make run` starts, on REDIS_PORT with REDIS_PASSWORD, both
#: written into .env on its first start (scripts/run.py), so scripts here reach it too.
_REDIS_PASSWORD = env("REDIS_PASSWORD", default="")
REDIS_URL = env(
    "REDIS_URL",
    default=(
        f"redis://{':' + quote(_REDIS_PASSWORD, safe='') + '@' if _REDIS_PASSWORD else ''}"
        f"127.0.0.1:{env.int('REDIS_PORT', default=6379)}/0"
    ),
)

CELERY_BROKER_URL = REDIS_URL
#: Celery's Redis backend, whose connections retry through a Redis restart.
CELERY_RESULT_BACKEND = f"dynamic_batching.store.result_backend:RetryingRedisBackend+{REDIS_URL}"
#: JSON only: pickle would let anyone who can write to the broker run code.
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
#: STARTED when a request's batch begins (its device stores it; docs/celery.md says what
#: it costs). A request STARTED finishes if revoked, as a started Celery task does.
CELERY_TASK_TRACK_STARTED = env.bool("TASK_TRACK_STARTED", default=True)

BATCHING = {
    "REDIS_URL": REDIS_URL,
    "CELERY_APP": "batching_site.celery.app",
    #: make run's devices: one worker each (empty: every CUDA device, else cpu:0,cpu:1).
    "DEVICES": env.list("DEVICES", default=[]),
    #: Where the dashboard links to Flower (`make run` starts it there, with basic auth).
    "FLOWER_URL": env("FLOWER_URL", default="http://127.0.0.1:5555/"),
}


def _check(ok: bool, variable: str, value: object, rule: str) -> None:
    """Refuse to start with a knob out of range, naming the variable and its value."""
    if not ok:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{variable} must be {rule}, got {value!r}")


# --- Web processes -------------------------------------------------------------------

#: Gunicorn worker processes of the web role (python -m batching_site.serve web).
WEB_WORKERS = env.int("WEB_WORKERS", default=2)
_check(WEB_WORKERS >= 1, "WEB_WORKERS", WEB_WORKERS, "at least 1")
#: Requests one web worker serves at once (uvicorn's limit_concurrency); past it, 503.
#: A request waiting on its answer (`?wait=`) is a coroutine on the worker's event loop.
WEB_CONNECTIONS = env.int("WEB_CONNECTIONS", default=1000)
_check(WEB_CONNECTIONS >= 1, "WEB_CONNECTIONS", WEB_CONNECTIONS, "at least 1")
#: Threads per web worker for the sync parts of requests (middleware, lookups, sync
#: views): most of that time is spent waiting on Redis or the database, so threads are
#: cheaper than more worker processes (batching_site/asgi.py).
WEB_THREADS = env.int("WEB_THREADS", default=8)
_check(WEB_THREADS >= 1, "WEB_THREADS", WEB_THREADS, "at least 1")

# --- Web: HTTPS, request limits, dashboard ---------------------------------------------
# Production: DJANGO_DEBUG unset, DJANGO_SECRET_KEY set (the same in every web process),
# DJANGO_ALLOWED_HOSTS, and DJANGO_SECURE_SSL_REDIRECT=1 unless a proxy redirects.
# `manage.py check --deploy` is then clean (tests/test_settings.py checks it).

#: Secure cookies and HSTS: on unless DEBUG. DJANGO_HTTPS=0 for plain HTTP on a
#: trusted network (browsers drop Secure cookies there, except on localhost).
HTTPS = env.bool("DJANGO_HTTPS", default=not DEBUG)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
#: A year of HSTS once HTTPS is on; browsers ignore the header over plain HTTP.
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=31_536_000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=HTTPS)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=HTTPS)
#: Django itself redirects HTTP to HTTPS. Opt-in: TLS usually ends at a proxy that
#: redirects already, and the test client and `make run` speak plain HTTP.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
#: Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it from clients).
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
#: WhiteNoise serves the admin's and the API docs' static files under gunicorn, found
#: in the apps at start-up, so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = True
# ...and so STATIC_ROOT may well not exist; WhiteNoise would warn in every process.
warnings.filterwarnings("ignore", message="No directory at")

#: Content-Security-Policy (django-csp): scripts only from this site, and a page's own
#: inline script only with the nonce made for that response, so an injected script
#: does not run (issue 42, finding 10). Styles may be inline (the charts colour their
#: lines with style attributes, and Swagger UI sets styles as it renders).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

#: Largest request body Django reads, in bytes; a bigger API call gets 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=1_048_576)
#: The dashboard sends people without a session here.
LOGIN_URL = "/login/"
#: Where a login with no ?next= lands: the submit page.
LOGIN_REDIRECT_URL = "/"
#: Passwords set through createsuperuser, changepassword or the admin's forms must pass
#: these: not like the username or email, at least 10 characters, not a common password,
#: not all digits.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
