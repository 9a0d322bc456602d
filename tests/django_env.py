"""Point Django at the test database before pytest-django imports the settings.

Loaded as a plugin (``-p tests.django_env`` in pyproject's ``addopts``) because pytest-django
imports ``stateguard_web.settings`` in its ``pytest_load_initial_conftests`` hook, before any
``conftest.py`` is imported: setting ``DATABASE_URL`` in a conftest is too late.

The test database is ``STATEGUARD_TEST_DATABASE_URL`` if set, else the local PostgreSQL; it
replaces any ``DATABASE_URL`` from the environment, so tests never run against the database
that ``make run`` or a deployment uses. pytest-django creates and drops ``test_<NAME>`` on that
server. Tests that do not use the database never connect to it. No ``.env`` file is read.
"""

from __future__ import annotations

import os

DEFAULT_TEST_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/stateguard"

os.environ["DATABASE_URL"] = (
    os.environ.get("STATEGUARD_TEST_DATABASE_URL") or DEFAULT_TEST_DATABASE_URL
)

# Celery's broker and the channel layer: the local Redis server (a database of its own), never
# the embedded one `make run` starts. Under pytest-xdist each worker (gw0, gw1...) has its own
# database, counted down from 15, as pytest-django gives each its own test database: a test that
# empties its queue (FLUSHDB) never empties another worker's. (The benches use 1-4, so that a
# bench and the suite can run on one machine at once.) STATEGUARD_TEST_REDIS_URL names another
# server; with "{db}" in it (redis://127.0.0.1:6390/{db}) each worker still has its own database.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
os.environ["REDIS_URL"] = (os.environ.get("STATEGUARD_TEST_REDIS_URL")
                           or "redis://127.0.0.1:6379/{db}").replace("{db}", str(15 - _WORKER))
os.environ.pop("CELERY_BROKER_URL", None)

# No file of variables: the .env that `make run` writes (DEBUG=true, localstripe's address, ...)
# must not change what the tests see, in this process or in those they start (settings.py,
# STATEGUARD_ENV_FILE; the manage_py fixture sets it again for each command it runs).
os.environ["STATEGUARD_ENV_FILE"] = ""

# DEBUG is off unless asked for (settings.py); the tests ask, so that the development SECRET_KEY
# is accepted and the HTTPS-only defaults stay off for the test client and the workers.
# pytest-django still runs each test with settings.DEBUG = False, as Django's runner does.
os.environ["DEBUG"] = "true"

# A fast password hash first (settings.py): the suite signs people in hundreds of times, here and
# in the servers it starts; PBKDF2 stays second, so that its hashes still check.
os.environ["PASSWORD_HASHERS"] = ("django.contrib.auth.hashers.MD5PasswordHasher,"
                                  "django.contrib.auth.hashers.PBKDF2PasswordHasher")

# No notifications unless a test asks for them (tests/web/test_notifications.py): under DEBUG they
# would e-mail the operators of every run that pauses, in this process and in the workers.
os.environ["STATEGUARD_NOTIFY_EMAIL"] = ""
os.environ.pop("STATEGUARD_NOTIFY_WEBHOOK_URL", None)
os.environ["STATEGUARD_WEBHOOKS_ALLOW_PRIVATE"] = "true"  # receivers on 127.0.0.1
# No mail server and no Outbox folder unless a test starts one (the ``mail_server`` fixture):
# under DEBUG the agents would mail `make run`'s server on 8025, if one is up, and the Outbox
# would list its var/mail/. A test that sends mail without one fails (nothing on port 25).
os.environ["EMAIL_URL"] = "smtp://127.0.0.1:25"
os.environ["STATEGUARD_MAIL_DIR"] = ""

# Every Stripe call once, unless a test asks for retries (tests/agents/test_stripe_retries.py):
# a test that makes Stripe fail sees its failure at once, not after the SDK's and the steps'
# retries (seconds of backoff each).
os.environ["STRIPE_MAX_NETWORK_RETRIES"] = "0"

# The dashboard asks every 2 s, not 15, whether a worker is alive: a browser test that stops the
# last worker waits for the banner that long (workers say goodbye; nothing else is faster).
os.environ["STATEGUARD_WORKERS_POLL_SECONDS"] = "2"
