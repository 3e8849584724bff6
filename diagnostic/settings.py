"""Django settings, read from the environment.

A checkout runs as it is (SQLite under out/, Celery in eager mode, email to files under
out/); a deployment switches each outside system on with one variable: DATABASE_URL,
CELERY_BROKER_URL, EMAIL_URL. Every variable is parsed by diagnostic.envconfig, which
stops start-up with the variable's name when a value makes no sense.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from diagnostic.envconfig import (
    database_from_url,
    email_from_url,
    envbool,
    envint,
    envlist,
    envstr,
    keyless_command,
    secret_key_message,
    secret_key_problem,
    sqlite_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent
OUT_DIR = Path(envstr("DIAG_OUT_DIR", str(BASE_DIR / "out")))

# Off unless asked for: a process that starts with no environment at all is a deployment
# that forgot something, and it must not serve tracebacks or sign sessions with a key
# anyone can read here. `make demo`, `make test` and the tests set DEBUG=1 themselves.
DEBUG = envbool("DEBUG", False)

# With DEBUG off a missing or weak key (diagnostic.envconfig.secret_key_problem) stops the
# settings from loading, in the web app, Celery and every other process, except a
# manage.py command that serves no web page (diagnose, measure, invite, migrate: see
# manage.py). Such a command gets an empty key, which Django refuses to sign with, and
# SECRET_KEY_PROBLEM says why. Only a development process (DEBUG=1 said out loud) may
# fall back to the public key below.
_secret = envstr("SECRET_KEY", "")
SECRET_KEY_PROBLEM = None if DEBUG else secret_key_problem(_secret)
if SECRET_KEY_PROBLEM is None:
    SECRET_KEY = _secret or "development-only-key-never-used-with-debug-off"
elif keyless_command() is not None:
    SECRET_KEY = ""
else:
    raise ImproperlyConfigured(secret_key_message(SECRET_KEY_PROBLEM))

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = envstr("SITE_URL", "http://localhost:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "csp",
    "diagnostic.bookings",
    "diagnostic.jobs",
    "diagnostic.pipelines",
    "diagnostic.accounts",
    "diagnostic.portal",
    "diagnostic.staff",
    "reports",
    # Optional TOTP second factor for staff (STAFF_REQUIRE_2FA).
    "django_otp",
    "django_otp.plugins.otp_totp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the app server (gunicorn), compressed and cache-busted.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # 400, naming the parameter, for NUL and other control characters in a path, query or form.
    "diagnostic.controlchars.ControlCharacterMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Marks a session whose user confirmed a TOTP code (request.user.is_verified()).
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "diagnostic.urls"
WSGI_APPLICATION = "diagnostic.wsgi.application"

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

# Database: SQLite file by default (DIAG_DB moves it), PostgreSQL through DATABASE_URL.
_database_url = envstr("DATABASE_URL", "")
if _database_url:
    _default_db = database_from_url(_database_url, base_dir=BASE_DIR)
else:
    _default_db = sqlite_database(Path(envstr("DIAG_DB", str(OUT_DIR / "db.sqlite3"))))
    if _default_db["NAME"] != ":memory:":
        Path(_default_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
_default_db["CONN_MAX_AGE"] = envint("DB_CONN_MAX_AGE", 0, minimum=0)
_default_db["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": _default_db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/portal/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# django-axes first: it refuses a locked-out account or address before a password is checked.
# Then Django's password check, whose session user comes with its organisation in one query.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "diagnostic.accounts.backends.PortalBackend",
]
# Failed logins (diagnostic.accounts.lockout): AXES_FAILURE_LIMIT failures against one
# account from one client address lock that client out of that account, and nobody else;
# AXES_ADDRESS_FAILURE_LIMIT failures from one address, whatever the accounts, lock that
# address out of every account. Both for AXES_COOLOFF_MINUTES after the last failure.
AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_ADDRESS_FAILURE_LIMIT = envint("AXES_ADDRESS_FAILURE_LIMIT", 20, minimum=1)
if AXES_ADDRESS_FAILURE_LIMIT < AXES_FAILURE_LIMIT:
    raise ImproperlyConfigured(
        f"AXES_ADDRESS_FAILURE_LIMIT={AXES_ADDRESS_FAILURE_LIMIT} must be at least AXES_FAILURE_LIMIT="
        f"{AXES_FAILURE_LIMIT}: it counts one address's failures against every account together")
AXES_COOLOFF_TIME = dt.timedelta(minutes=envint("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_HANDLER = "diagnostic.accounts.lockout.AccountAndAddressHandler"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "diagnostic.accounts.views.locked_out"
AXES_VERBOSE = False
# The client's address (diagnostic.accounts.clientip, with django-ipware). Behind proxies,
# AXES_IPWARE_PROXY_COUNT is how many stand between the clients and the app, each appending
# to X-Forwarded-For the address it received the request from (compose: 1, the TLS proxy on
# the host). The client is then the hop just before them, counted from the right, so what a
# client writes into X-Forwarded-For itself is never taken for its address. 0 (the default):
# clients connect to the app directly, and X-Forwarded-For, which anyone can write, is
# ignored. Set it to the real number: one too few and every client counts as the proxy (one
# person's failures lock out everyone), one too many and a client picks its own address.
AXES_IPWARE_PROXY_COUNT = envint("AXES_IPWARE_PROXY_COUNT", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "diagnostic.accounts.clientip.client_address"
PASSWORD_RESET_TIMEOUT = envint("PASSWORD_RESET_TIMEOUT_S", 3 * 24 * 3600, minimum=600)
# Password reset emails: at most this many requests per client address, and per email
# address asked for (with an account or not), in each window of PASSWORD_RESET_WINDOW_S;
# past either, the page says to try again later and sends nothing (diagnostic.accounts.views).
PASSWORD_RESET_WINDOW_S = envint("PASSWORD_RESET_WINDOW_S", 900, minimum=60)
PASSWORD_RESET_LIMIT_PER_ADDRESS = envint("PASSWORD_RESET_LIMIT_PER_ADDRESS", 10, minimum=1)
PASSWORD_RESET_LIMIT_PER_ACCOUNT = envint("PASSWORD_RESET_LIMIT_PER_ACCOUNT", 3, minimum=1)

# Django's cache holds the throttles' counters: Redis through CACHE_URL (redis://host:6379/1)
# so that every process counts together, as a deployment needs; this process's memory when
# unset (development, the tests).
_cache_url = envstr("CACHE_URL", "")
if _cache_url:
    _cache_scheme = urlsplit(_cache_url).scheme.lower()
    if _cache_scheme not in ("redis", "rediss"):
        raise ImproperlyConfigured(
            f"CACHE_URL has the scheme {_cache_scheme!r}; use redis://host:6379/1 (or rediss://)")
    CACHES: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                          "LOCATION": _cache_url, "KEY_PREFIX": "diagnostic"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                          "LOCATION": "diagnostic"}}

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(envstr("STATIC_ROOT", str(OUT_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Development serves the apps' static folders directly; a deployment runs collectstatic.
WHITENOISE_USE_FINDERS = DEBUG
# Reports and tuned configurations are served only by views that check ownership; there
# is no public media URL.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(OUT_DIR / "media")}},
    "staticfiles": {"BACKEND": (
        "django.contrib.staticfiles.storage.StaticFilesStorage" if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage")},
}

# Uploads (the portal's configuration file): held to the portal's limit while they arrive,
# in memory, never written to disk; what is past the limit is counted and dropped
# (diagnostic.portal.uploads), and the page says the file's size and the limit.
FILE_UPLOAD_HANDLERS = ["diagnostic.portal.uploads.BoundedUploadHandler"]
# The portal's forms hold one file; a request with more is refused (400) before it is read.
DATA_UPLOAD_MAX_NUMBER_FILES = 4

# Cookies: HttpOnly sessions always, SameSite=Lax; Secure whenever DEBUG is off.
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = envint("SESSION_COOKIE_AGE_S", 12 * 3600, minimum=300)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if not DEBUG:
    SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", True)
    # TLS ends at the proxy in front of gunicorn, which says so in X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", True)
    # /healthz answers the load balancer over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

# Content-Security-Policy: our own scripts and styles only, nothing inline.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    },
}

# Email: files under out/email by default, SMTP through EMAIL_URL or EMAIL_HOST.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def serves_only_this_machine(allowed_hosts: list[str], site_url: str) -> bool:
    """Whether a process answers only names of this machine: ALLOWED_HOSTS lists loopback
    names alone (at least one) and SITE_URL, the links' address, is on loopback too."""
    site_host = (urlsplit(site_url).hostname or "").lower()
    return (bool(allowed_hosts) and all(h.strip().lower() in LOOPBACK_HOSTS for h in allowed_hosts)
            and site_host in LOOPBACK_HOSTS)


DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "diagnostic@localhost")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
# Who hears at once when a lab fault holds a diagnostic day, for a lab with no contact of
# its own (Lab.contact_email).
DIAG_LAB_CONTACT_EMAIL = envstr("DIAG_LAB_CONTACT_EMAIL", "lab@localhost")
_email_url = envstr("EMAIL_URL", "")
if _email_url:
    _email: dict[str, Any] = email_from_url(_email_url)
elif envstr("EMAIL_HOST", ""):
    _email = {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": envstr("EMAIL_HOST", ""),
        "EMAIL_PORT": envint("EMAIL_PORT", 25, minimum=1, maximum=65535),
        "EMAIL_HOST_USER": envstr("EMAIL_HOST_USER", ""),
        "EMAIL_HOST_PASSWORD": envstr("EMAIL_HOST_PASSWORD", ""),
        "EMAIL_USE_TLS": envbool("EMAIL_USE_TLS", False),
        "EMAIL_USE_SSL": envbool("EMAIL_USE_SSL", False),
    }
else:
    _email = {
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(Path(envstr("EMAIL_FILE_PATH", str(OUT_DIR / "email")))),
    }
    # Files under out/email are for development. With DEBUG off they would take customers'
    # password-reset and invitation links and reports where nobody reads them, so the web
    # app and Celery refuse to start without EMAIL_URL or EMAIL_HOST. Not refused: the
    # manage.py commands that run without SECRET_KEY (migrate, diagnose, invite, which
    # prints its link), and a process that only this machine can reach (ALLOWED_HOSTS and
    # SITE_URL on loopback: a benchmark, a smoke test); `check --deploy` still fails there
    # (diagnostic.E002).
    if not DEBUG and keyless_command() is None and not serves_only_this_machine(ALLOWED_HOSTS, SITE_URL):
        raise ImproperlyConfigured(
            "EMAIL_URL is not set (nor EMAIL_HOST): with DEBUG off, password resets, invitations and "
            "reports must reach people, not files under out/email; set EMAIL_URL=smtp+tls://user:password"
            "@mail.example.com:587 (or the EMAIL_HOST settings), or DEBUG=1 for development")
EMAIL_BACKEND: str = _email.pop("EMAIL_BACKEND")
EMAIL_HOST: str = _email.get("EMAIL_HOST", "localhost")
EMAIL_PORT: int = _email.get("EMAIL_PORT", 25)
EMAIL_HOST_USER: str = _email.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD: str = _email.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS: bool = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL: bool = _email.get("EMAIL_USE_SSL", False)
EMAIL_FILE_PATH: str = _email.get("EMAIL_FILE_PATH", str(OUT_DIR / "email"))
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 30, minimum=1)

# Structured logging: one key=value line per event on stderr.
LOG_LEVEL = envstr("LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(f"LOG_LEVEL={LOG_LEVEL!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL")
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"kv": {"()": "diagnostic.logfmt.KeyValueFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "kv"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "diagnostic": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "lab": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "reports": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "celery": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "django": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}

# Diagnostic jobs: leases, attempts and retry timing (seconds, wall clock).
DIAG_MAX_STAGE_ATTEMPTS = envint("DIAG_MAX_STAGE_ATTEMPTS", 3, minimum=1)
DIAG_STAGE_LEASE_S = envint("DIAG_STAGE_LEASE_S", 120, minimum=2)
DIAG_LAB_LEASE_S = envint("DIAG_LAB_LEASE_S", 300, minimum=2)
# Leases are renewed several times per lease period so one slow renewal does not lose them.
DIAG_HEARTBEAT_S = envint("DIAG_HEARTBEAT_S", max(1, DIAG_STAGE_LEASE_S // 4), minimum=1)
DIAG_RETRY_BASE_S = envint("DIAG_RETRY_BASE_S", 15, minimum=0)
DIAG_RETRY_MAX_S = envint("DIAG_RETRY_MAX_S", 900, minimum=0)
DIAG_LAB_BUSY_RETRY_S = envint("DIAG_LAB_BUSY_RETRY_S", 60, minimum=1)
DIAG_STAGE_TIME_LIMIT_S = envint("DIAG_STAGE_TIME_LIMIT_S", 5400, minimum=60)
DIAG_REAPER_INTERVAL_S = envint("DIAG_REAPER_INTERVAL_S", 60, minimum=1)
# A job confirmed ahead of its booking's lab day waits, queued; celery beat looks this
# often for jobs whose day has begun (midnight in TIME_ZONE, the lab's time) and starts them.
DIAG_LAB_DAY_START_INTERVAL_S = envint("DIAG_LAB_DAY_START_INTERVAL_S", 60, minimum=1)
# How long a stage's bookkeeping (its completion, its release for a retry) waits out a
# database that is away before giving up; a restart takes seconds.
DIAG_DB_OUTAGE_S = envint("DIAG_DB_OUTAGE_S", 60, minimum=0)
# A job still queued this long after it was created lost its message (the broker was down
# at submit, or restarted empty): the reaper enqueues it again (duplicates are harmless).
DIAG_QUEUED_REQUEUE_S = envint("DIAG_QUEUED_REQUEUE_S", 300, minimum=1)
# The synchronous `diagnose` gives up after this long (a lab day, with room to spare).
DIAG_DIAGNOSE_TIME_LIMIT_S = envint("DIAG_DIAGNOSE_TIME_LIMIT_S", 12 * 3600, minimum=60)
# Lab seconds a whole diagnostic day may spend (diagnose --budget-lab-s overrides per job).
# METHODOLOGY.md's target is two lab hours; the reference day measures about 2.5 today
# (diagnostic/jobs/budget.py), so the default leaves it room.
DIAG_DAY_BUDGET_LAB_S = envint("DIAG_DAY_BUDGET_LAB_S", 10800, minimum=60)
DIAG_SIM_STATE_DIR = Path(envstr("DIAG_SIM_STATE_DIR", str(OUT_DIR / "labsim")))
# Owner of configurations and jobs run without a booking (demo, `diagnose`); no customer
# belongs to it, so the portal never shows them.
DIAG_HOUSE_ORGANISATION = envstr("DIAG_HOUSE_ORGANISATION", "In-house diagnostics")

# Customer portal. Bookings can be cancelled or moved until this many hours before the
# lab day starts. Reports reach customers once staff approve them; PORTAL_AUTO_APPROVE
# (on by default only with DEBUG, for the demo) releases each version as it is written.
BOOKING_CHANGE_CUTOFF_H = envint("BOOKING_CHANGE_CUTOFF_H", 48, minimum=0)
# Off: the calendar offers only days outside the cutoff (a booking can always be changed
# once). On: days inside it, today included, can be booked too, knowing they cannot be
# changed; a job for today starts at confirmation (the walk-through, the browser tests).
BOOKING_SAME_DAY = envbool("BOOKING_SAME_DAY", False)
PORTAL_AUTO_APPROVE = envbool("PORTAL_AUTO_APPROVE", DEBUG)
# The stages a portal job runs, in registry order (empty: all). The required ones
# (preflight, reproduce, report) always run.
PORTAL_JOB_STAGES = envlist("PORTAL_JOB_STAGES", [])
PORTAL_CALENDAR_DAYS = envint("PORTAL_CALENDAR_DAYS", 56, minimum=7)
# What the booking pages say a lab day costs, in the firm's own words (e.g. "EUR 4,800 per
# lab day, excluding VAT"); unset, they refer the customer to the price in their order.
PORTAL_LAB_DAY_PRICE = envstr("PORTAL_LAB_DAY_PRICE", "")
# One organisation holds at most this many upcoming lab days at once (not cancelled or
# completed); the portal refuses another, naming the days it holds.
BOOKING_MAX_OPEN_PER_ORG = envint("BOOKING_MAX_OPEN_PER_ORG", 3, minimum=1)
# The job page asks for fresh stage states this often (milliseconds).
PORTAL_POLL_MS = envint("PORTAL_POLL_MS", 3000, minimum=2000, maximum=5000)
# Invitation links stop working after this many days (and after their first use).
INVITE_VALID_DAYS = envint("INVITE_VALID_DAYS", 7, minimum=1)
if DIAG_HEARTBEAT_S >= DIAG_STAGE_LEASE_S or DIAG_HEARTBEAT_S >= DIAG_LAB_LEASE_S:
    raise ImproperlyConfigured(
        f"DIAG_HEARTBEAT_S={DIAG_HEARTBEAT_S} must be shorter than DIAG_STAGE_LEASE_S="
        f"{DIAG_STAGE_LEASE_S} and DIAG_LAB_LEASE_S={DIAG_LAB_LEASE_S}, or leases lapse while held"
    )

# Staff dashboard. STAFF_REQUIRE_2FA makes every staff page and the admin ask for a TOTP
# code first (django-otp); on unless DEBUG is (`check --deploy` warns when it is off). A
# consultant without a device enrols one only through a one-time link another member of
# the staff group issues (/staff/2fa/links/) or `manage.py otp_enrol_link EMAIL` prints,
# opened signed in as that account within STAFF_OTP_ENROL_LINK_HOURS; a password alone never
# shows a secret (diagnostic.staff.enrolment). The lab health poll runs this often under
# Celery beat; the job pages refresh this often (ms).
STAFF_REQUIRE_2FA = envbool("STAFF_REQUIRE_2FA", not DEBUG)
STAFF_OTP_ENROL_LINK_HOURS = envint("STAFF_OTP_ENROL_LINK_HOURS", 24, minimum=1, maximum=7 * 24)
STAFF_LAB_HEALTH_INTERVAL_S = envint("STAFF_LAB_HEALTH_INTERVAL_S", 60, minimum=10)
STAFF_POLL_MS = envint("STAFF_POLL_MS", 2000, minimum=1000, maximum=10000)
OTP_TOTP_ISSUER = "Lab diagnostic staff"

# Celery: Redis through CELERY_BROKER_URL; without it tasks run in-process (eager).
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
if not CELERY_BROKER_URL:
    CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = envstr("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_TASK_DEFAULT_QUEUE = envstr("DIAG_QUEUE", "diagnostic")
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
# A stage may be cut off mid-way (worker killed, machine lost): the message stays
# unacknowledged and goes back to the queue, and stages check their own completion.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = DIAG_STAGE_TIME_LIMIT_S
CELERY_TASK_SOFT_TIME_LIMIT = DIAG_STAGE_TIME_LIMIT_S - 30
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Redis re-delivers an unacknowledged message after the visibility timeout. It must
# exceed the longest task and the longest retry countdown (countdowns are held
# unacknowledged by the worker), or a healthy task is delivered twice.
DIAG_VISIBILITY_TIMEOUT_S = envint("DIAG_VISIBILITY_TIMEOUT_S", 7200, minimum=60)
_longest_wait = max(CELERY_TASK_TIME_LIMIT, DIAG_RETRY_MAX_S, DIAG_LAB_BUSY_RETRY_S)
if DIAG_VISIBILITY_TIMEOUT_S <= _longest_wait:
    raise ImproperlyConfigured(
        f"DIAG_VISIBILITY_TIMEOUT_S={DIAG_VISIBILITY_TIMEOUT_S} must exceed the stage time limit "
        f"({CELERY_TASK_TIME_LIMIT} s) and every retry countdown (up to {DIAG_RETRY_MAX_S} s)"
    )
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": DIAG_VISIBILITY_TIMEOUT_S}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": DIAG_VISIBILITY_TIMEOUT_S}
CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {
        "task": "diagnostic.jobs.tasks.reap_expired_leases",
        "schedule": float(DIAG_REAPER_INTERVAL_S),
    },
    # Jobs confirmed ahead of their lab day start within this period of the day's start.
    "start-due-jobs": {
        "task": "diagnostic.jobs.tasks.start_due_jobs",
        "schedule": float(DIAG_LAB_DAY_START_INTERVAL_S),
    },
    # The lab page's node states; a node that stops answering shows within this period.
    "poll-lab-health": {
        "task": "diagnostic.staff.tasks.poll_lab_health",
        "schedule": float(STAFF_LAB_HEALTH_INTERVAL_S),
    },
}

# The reports app links its rows (money-back decisions, report emails) to the platform's
# job through this model reference, so it imports nothing of the platform itself.
REPORTS_JOB_MODEL = "jobs.DiagnosticJob"

# Report rendering runs in a child process with these limits (reports/pdf.py).
REPORT_RENDER_TIMEOUT_S = envint("REPORT_RENDER_TIMEOUT_S", 60, minimum=5)
REPORT_RENDER_MEMORY_MB = envint("REPORT_RENDER_MEMORY_MB", 3072, minimum=512)
