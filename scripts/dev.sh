#!/usr/bin/env bash
# One entry point for the project's jobs; the Makefile targets call it.
#
#   scripts/dev.sh venv    create .venv and install the package with every extra the
#                          tests, the linters and the pipeline use (as `test` does)
#   scripts/dev.sh test    lint, checks, the docs, `dist` (below), the whole suite on PostgreSQL and
#                          SQLite (and its core again on PostgreSQL with prepared
#                          statements, and through PgBouncer; the queue-on-its-own-database
#                          tests on two databases of each), on MariaDB/MySQL when one is reachable, then the
#                          Django 6 leg (below)
#   scripts/dev.sh quick   the inner loop: the suite without the browser, Spark, processes or
#                          docs, on PostgreSQL and SQLite at once (make test-quick)
#   scripts/dev.sh pgbouncer  only the core suite through PgBouncer (the leg of `test`)
#   scripts/dev.sh coverage   branch coverage of the package over the database legs
#   scripts/dev.sh docs    build the documentation site (docs/_build/html), warnings as errors
#   scripts/dev.sh dist    build the sdist and the wheel into dist/, twine check them, and
#                          check their contents and a fresh install (scripts/check_dist.py)
#   scripts/dev.sh django6 the matrix's second leg: Python 3.12+ and Django 6.x in
#                          .venv-dj6, checks plus the Tasks backend and a core smoke subset
#   scripts/dev.sh demo    run the example project on its SQLite default
#
# Works on a fresh Debian machine with Python 3.11+: what is missing is
# installed with apt when running as root (or through sudo). `demo` installs
# into .venv only what the example project needs (Django, the app,
# django-environ, django-tasks), and from apt at most python3-venv; `test`
# and `venv` install every extra (pyspark, playwright, mypy, mysqlclient, ...)
# and from apt python3-venv, libmariadb-dev, pkg-config, chromium,
# chromium-driver, a Java 17 runtime, the PostgreSQL, MariaDB and SQLite JDBC
# drivers, PostgreSQL when no server answers (scripts/ensure-postgres.sh), and
# pgbouncer (scripts/ensure-pgbouncer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# The suite starts hundreds of Python processes (pytest-xdist's, run_delayq's,
# manage.py's): without bytecode caches each compiles the package again and
# pytest rewrites every test module's assertions again (about 4 s of CPU per
# pytest process). An environment that turns the caches off (as some
# containers do) is overridden here; __pycache__ is ignored by git.
unset PYTHONDONTWRITEBYTECODE

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"

log() { printf '\n==> %s\n' "$*"; }

minutes() { printf '%d min %02d s' $(( $1 / 60 )) $(( $1 % 60 )); }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

ensure_venv() {
  # ensure_venv EXTRAS: create $VENV if needed and install the package
  # (editable) with these extras. It only adds: what another target
  # installed before stays (make demo, then make test, share .venv).
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' || {
    echo "Python 3.11+ is required (PYTHON=$PYTHON)" >&2; exit 2; }
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      apt_install python3-venv
      "$PYTHON" -m venv "$VENV"
    fi
  fi
  log "installing django-delayq[$1] into $VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e ".[$1]"
}

ensure_full_venv() {
  # Everything the checks and the whole suite use.
  local extras="postgres,test,example,dev,dist,spark,docs"
  if ensure_mysqlclient_build; then
    extras="$extras,mysql"
  else
    log "cannot install libmariadb-dev here: no mysqlclient, so no MariaDB/MySQL test run"
  fi
  ensure_venv "$extras"
}

ensure_mysqlclient_build() {
  # mysqlclient (the mysql extra) is a C extension PyPI ships as source for
  # Linux: it builds against Debian's libmariadb-dev, found by pkg-config.
  if ! pkg-config --exists libmariadb 2>/dev/null && ! pkg-config --exists mysqlclient 2>/dev/null; then
    log "installing libmariadb-dev and pkg-config to build mysqlclient"
    apt_install libmariadb-dev pkg-config
  fi
}

ensure_chromium() {
  # The admin's browser tests drive Debian's Chromium through Playwright
  # (Playwright's own browser download is not used).
  if [ -z "${DELAYQ_CHROMIUM:-}" ] && ! command -v chromium >/dev/null; then
    log "installing Debian's chromium for the browser tests"
    apt_install chromium chromium-driver
  fi
}

ensure_spark_runtime() {
  # The data pipeline (delayq_pipeline) runs Spark on Java 17+ and reads the
  # queue table through Debian's JDBC drivers (nothing comes from Maven):
  # PostgreSQL's, MariaDB's (for MariaDB and MySQL) and SQLite's.
  local missing=() version
  version="$("${JAVA_HOME:+$JAVA_HOME/bin/}java" -version 2>&1 || true)"
  grep -Eq 'version "(1[7-9]|[2-9][0-9])' <<<"$version" || missing+=(openjdk-17-jre-headless)
  [ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
  [ -f /usr/share/java/sqlite-jdbc.jar ] || missing+=(libxerial-sqlite-jdbc-java)
  [ -f /usr/share/java/mariadb-java-client.jar ] || missing+=(libmariadb-java)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]} for the Spark data pipeline"
    apt_install "${missing[@]}"
  fi
}

build_docs() {
  # Sphinx, nitpicky, warnings as errors, from a fresh environment: a broken
  # link, an unresolvable name or an undocumented command fails the build.
  log "documentation: sphinx-build -W -n (docs/_build/html)"
  "$PY" -m sphinx -W --keep-going -n -q -E -b html -d docs/_build/doctrees docs docs/_build/html
}

run_docs() {
  # The documentation leg of make test: build the site, then check the built
  # reference pages against the code (every setting, every command option).
  # The pages' Python examples run with the suite (tests/docs).
  build_docs
  DELAYQ_DOCS_HTML=docs/_build/html "$PY" -m pytest -q -p no:cacheprovider \
    tests/docs/test_reference.py
}

run_checks() {
  log "lint and Django checks"
  "$VENV/bin/ruff" check django_delayq tests example_project benchmarks scripts docs
  "$VENV/bin/mypy" django_delayq tests/chaos
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django check
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django makemigrations --check --dry-run
}

run_dist() {
  # dist/ holds what a release would upload: built from a clean slate, the
  # metadata checked as PyPI would (twine), and the wheel's contents and a
  # fresh install of it checked (scripts/check_dist.py).
  log "building the sdist and the wheel into dist/"
  rm -f dist/django_delayq-*
  local out
  if ! out="$("$PY" -m build --outdir dist . 2>&1)"; then
    printf '%s\n' "$out" >&2
    return 1
  fi
  "$PY" -m twine check --strict dist/django_delayq-*
  "$PY" scripts/check_dist.py dist
}

# The suite runs in parallel (pytest-xdist) where its tests are independent:
# each of the WORKERS processes has its own test database (pytest-django adds
# _gw0, _gw1... to its name) and takes whole files (tests/conftest.py: a file's
# tests share fixtures and run in their order; the Spark pipeline's run in two
# processes, each of which starts a JVM for them). Most of a test's
# time is spent waiting on another process (a worker, a subprocess, the
# database), so there are more of them than cores. The browser tests run
# after, in one process (Playwright keeps one Chromium for the session).
WORKERS="${DELAYQ_TEST_WORKERS:-$(( $(nproc) + 2 ))}"
PARALLEL=(-n "$WORKERS" --dist loadfile)

# PostgreSQL runs the whole suite. SQLite and MariaDB/MySQL run what differs
# by database: the store's conformance suite, the enqueue API and the worker
# (integration), real run_delayq processes, the short chaos and adversary
# runs, the admin's queries, and the pipeline's reads and writes through each
# JDBC driver. Left to PostgreSQL's leg: what never reaches the database or
# reaches it only through what the rest covers: the unit tests, the
# documentation's examples, the browser, the Tasks backend (on SQLite in the
# Django 6 leg), the cron's and the testing helpers' API above the store, the
# development reloader, log lines and signals, and the pipeline's input
# checks, rejects file, JSON-lines parsing, payload property through Spark's
# JSON reader and standalone cluster. `make test-quick` and
# `DATABASE_URL=... pytest` still run them anywhere.
DATABASE_LEG=(
  --ignore=tests/unit --ignore=tests/browser --ignore=tests/docs
  --ignore=tests/integration/test_tasks_backend.py --ignore=tests/integration/test_cron.py
  --ignore=tests/integration/test_testing_helpers.py --ignore=tests/integration/test_reload.py
  --ignore=tests/integration/test_logs.py --ignore=tests/integration/test_signals.py
  --ignore=tests/pipeline/test_bad_input.py --ignore=tests/pipeline/test_rejects.py
  --ignore=tests/pipeline/test_json_lines.py
  --ignore=tests/pipeline/test_payload_property.py --ignore=tests/pipeline/test_cluster.py
  # The worker's health probes and metrics endpoints (HTTP, the same on every database).
  --ignore=tests/process/test_health.py --ignore=tests/process/test_metrics.py
  # The pipeline's files (their modes, planted links) and an archive killed
  # by the operating system (every stage it can stop at is interrupted on
  # each database by test_archive_interrupted_at_any_stage...).
  --deselect tests/pipeline/test_archive.py::test_archive_killed_midway_and_rerun
  --deselect tests/pipeline/test_archive.py::test_the_archive_is_its_owners_only_whatever_the_umask
  --deselect tests/pipeline/test_report.py::test_report_files_never_follow_planted_links_and_are_private
)

PREPARED_TESTS=(
  tests/store tests/integration/test_enqueue.py tests/integration/test_worker.py
  tests/integration/test_acks.py tests/integration/test_atomic_groups.py
  tests/integration/test_limits.py tests/integration/test_groups.py
  # Real processes send the statements the in-process tests above send: one
  # file of them (their LISTEN, their shutdown), not the rest.
  tests/process/test_run_delayq.py
)

run_suite() {
  local pg_url sqlite_url
  pg_url="$(scripts/ensure-postgres.sh)"
  sqlite_url="sqlite:///${TMPDIR:-/tmp}/delayq-suite-$(id -u).sqlite3"
  log "test suite on PostgreSQL ($pg_url, $WORKERS processes; the 30 slowest tests listed)"
  # (The tutorial on Django 6.1 is followed in the Django 6 leg.)
  DATABASE_URL="$pg_url" "$PY" -m pytest "${PARALLEL[@]}" -m "not browser" --durations=30 \
    --deselect "tests/docs/test_tutorial.py::test_the_tutorial_shows_what_its_commands_print[django-6.1]" \
    "$@"
  log "the admin in a real browser, on PostgreSQL"
  DATABASE_URL="$pg_url" "$PY" -m pytest -m browser "$@" tests/browser
  log "example project's tests on PostgreSQL"
  DATABASE_URL="$pg_url" "$PY" -m pytest -q -p no:cacheprovider example_project
  # The configuration the README recommends for speed (server-side parameters
  # and prepared statements): every statement the store sends (its
  # conformance suite), the enqueue API, the worker and its acknowledgements,
  # limits and groups in process, and real run_delayq processes.
  log "core suite on PostgreSQL with prepared statements"
  DELAYQ_TEST_PREPARED=1 DATABASE_URL="$pg_url" "$PY" -m pytest -q -p no:cacheprovider \
    "${PARALLEL[@]}" "${PREPARED_TESTS[@]}"
  run_pgbouncer_suite "$pg_url"
  log "test suite on SQLite: what differs by database ($sqlite_url, $WORKERS processes)"
  DATABASE_URL="$sqlite_url" "$PY" -m pytest "${PARALLEL[@]}" "${DATABASE_LEG[@]}" "$@"
  log "example project's tests on SQLite"
  DATABASE_URL="$sqlite_url" "$PY" -m pytest -q -p no:cacheprovider example_project
  run_queue_database_suite "$pg_url" "$sqlite_url"
  run_mysql_suite "$@"
}

# -- make coverage: branch coverage of django_delayq across the database legs -------

run_coverage() {
  # The PostgreSQL leg (without the browser) and the SQLite and MariaDB/MySQL
  # legs, under coverage.py (pyproject.toml: every process, branches), then
  # the total. COVERAGE_LEGS=full runs the whole suite on every database
  # instead, for comparing a choice of what DATABASE_LEG leaves out.
  local pg_url sqlite_url url legs=("${DATABASE_LEG[@]}")
  [ "${COVERAGE_LEGS:-}" = full ] && legs=(--ignore=tests/browser)
  pg_url="$(scripts/ensure-postgres.sh)"
  sqlite_url="sqlite:///${TMPDIR:-/tmp}/delayq-coverage-$(id -u).sqlite3"
  rm -rf .coverage-data && mkdir -p .coverage-data
  log "coverage: PostgreSQL"
  DATABASE_URL="$pg_url" "$PY" -m coverage run -m pytest -q -p no:cacheprovider \
    "${PARALLEL[@]}" -m "not browser" "$@" || true
  log "coverage: SQLite"
  DATABASE_URL="$sqlite_url" "$PY" -m coverage run -m pytest -q -p no:cacheprovider \
    "${PARALLEL[@]}" "${legs[@]}" "$@" || true
  url="$(mysql_url)"
  if [ -n "$url" ]; then
    log "coverage: MariaDB/MySQL"
    DATABASE_URL="$url" "$PY" -m coverage run -m pytest -q -p no:cacheprovider \
      "${PARALLEL[@]}" "${legs[@]}" "$@" || true
  fi
  "$PY" -m coverage combine -q
  "$PY" -m coverage report
  log "branch coverage of django_delayq: $("$PY" -m coverage report --format=total)%"
}

# -- make test-quick: the inner loop ---------------------------------------------

ensure_quick_venv() {
  # The full .venv if it is there (make test made it), else what the quick
  # run needs: no Spark, browser, linters or MariaDB driver.
  if [ -x "$PY" ] && "$PY" -c 'import pytest_django, xdist, psycopg' 2>/dev/null; then
    return 0
  fi
  ensure_venv "postgres,test,example"
}

# What the quick run leaves out: the browser, the Spark pipeline, the tests
# that start run_delayq processes (the chaos and adversary runs among them),
# the fault injection at each of the worker's call sites and the
# documentation. make test runs them all.
QUICK=(
  -m "not browser and not pipeline and not process"
  --ignore=tests/docs --ignore=tests/integration/test_faults.py tests
)

run_quick() {
  # PostgreSQL and SQLite at the same time, each in WORKERS processes; the
  # SQLite run's output is shown after PostgreSQL's.
  local pg_url sqlite_url sqlite_log status=0 sqlite_status=0 pid
  pg_url="$(scripts/ensure-postgres.sh)"
  sqlite_url="sqlite:///${TMPDIR:-/tmp}/delayq-quick-$(id -u).sqlite3"
  sqlite_log="$(mktemp)"
  log "quick suite on PostgreSQL ($pg_url) and SQLite ($sqlite_url)"
  DATABASE_URL="$sqlite_url" "$PY" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" \
    "${QUICK[@]}" "$@" >"$sqlite_log" 2>&1 &
  pid=$!
  DATABASE_URL="$pg_url" "$PY" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" \
    "${QUICK[@]}" "$@" || status=$?
  wait "$pid" || sqlite_status=$?
  log "quick suite on SQLite"
  cat "$sqlite_log"
  rm -f "$sqlite_log"
  log "make test-quick: $(minutes "$SECONDS")"
  [ "$status" = 0 ] && [ "$sqlite_status" = 0 ]
}

# -- PgBouncer: the core through a pooler in transaction mode --------------------

# What a pooled deployment exercises: enqueue, claims, acknowledgements, leases,
# cron, locks (integration, store), real run_delayq processes and the short chaos
# run, in about a minute and a half. Left out: tests/unit (no database), the admin and
# the pipeline, the state machine's long random walk (one connection, the
# statements integration covers), the multi-process flow control runs (a
# minute of waiting on rate windows; their claims run through the pool in
# tests/integration) and the fault injection at every call site of the worker
# (tests/integration/test_faults.py: the PostgreSQL leg's; through a pooler it
# would test nothing more), and the adversary run (tests/chaos/test_adversaries.py:
# its lock holders and operators are sessions of their own, on the direct leg),
# and the worker's HTTP probes and metrics.
PGBOUNCER_TESTS=(
  tests/integration tests/store tests/process tests/chaos
  --ignore=tests/store/test_state_machine.py --ignore=tests/process/test_flow_control.py
  --ignore=tests/integration/test_faults.py --ignore=tests/chaos/test_adversaries.py
  # What a pooler cannot change: validation and payload round trips (the
  # statements are the enqueue's, run here by test_enqueue), the Tasks
  # backend, the testing helpers, the reloader, log lines and signals.
  --ignore=tests/integration/test_hostile_input.py
  --ignore=tests/integration/test_payload_roundtrip.py
  --ignore=tests/integration/test_payload_property.py
  --ignore=tests/integration/test_tasks_backend.py
  --ignore=tests/integration/test_testing_helpers.py --ignore=tests/integration/test_reload.py
  --ignore=tests/integration/test_logs.py --ignore=tests/integration/test_signals.py
  --ignore=tests/process/test_health.py --ignore=tests/process/test_metrics.py
  --ignore=tests/process/test_tasks_processes.py
)

run_pgbouncer_suite() {
  # Every statement through PgBouncer (pool_mode = transaction, a pool of 2
  # server connections per database, scripts/ensure-pgbouncer.sh: each test
  # process's database has its own); the workers' LISTEN and the tests that
  # need a session of their own on the direct alias "direct" (DELAYQ_TEST_DIRECT_URL).
  local pooled
  pooled="$(scripts/ensure-pgbouncer.sh "$1")"
  log "core suite through PgBouncer ($pooled, transaction pooling)"
  if ! DATABASE_URL="$pooled" DELAYQ_TEST_DIRECT_URL="$1" "$PY" -m pytest -q -p no:cacheprovider \
      "${PARALLEL[@]}" "${PGBOUNCER_TESTS[@]}"; then
    scripts/ensure-pgbouncer.sh stop
    return 1
  fi
  scripts/ensure-pgbouncer.sh stop
}

run_queue_database_suite() {
  # The queue on its own database: a second alias "queue" (a database next to
  # the first), DELAYQ["DATABASE"] and DelayQRouter (tests/settings.py).
  local pg_url="$1" sqlite_url="$2" base
  base="${pg_url%%\?*}"
  log "queue on its own database, PostgreSQL (${base}_queue)"
  DATABASE_URL="$pg_url" DELAYQ_TEST_QUEUE_URL="${base}_queue${pg_url#"$base"}" \
    "$PY" -m pytest -q -p no:cacheprovider tests/queue_database tests/unit/test_routers.py \
    tests/pipeline/test_queue_database.py
  log "queue on its own database, SQLite (two files)"
  DATABASE_URL="$sqlite_url" DELAYQ_TEST_QUEUE_URL="${sqlite_url%.sqlite3}-queue.sqlite3" \
    "$PY" -m pytest -q -p no:cacheprovider tests/queue_database tests/unit/test_routers.py
}

# -- MariaDB / MySQL: when DATABASE_URL points at one, or one answers locally -----

mysql_url() {
  # DATABASE_URL if it is a mysql:// URL, else root (no password) on
  # 127.0.0.1:3306 (DELAYQ_MYSQL_HOST / DELAYQ_MYSQL_PORT) if that logs in.
  if [[ "${DATABASE_URL:-}" == mysql://* ]]; then
    echo "$DATABASE_URL"
    return
  fi
  local host="${DELAYQ_MYSQL_HOST:-127.0.0.1}" port="${DELAYQ_MYSQL_PORT:-3306}"
  if "$PY" -c 'import sys, MySQLdb; MySQLdb.connect(host=sys.argv[1], port=int(sys.argv[2]), user="root", connect_timeout=3).close()' \
      "$host" "$port" 2>/dev/null; then
    echo "mysql://root@$host:$port/delayq_suite_$(id -u)"
  fi
}

run_mysql_suite() {
  # What differs by database (DATABASE_LEG above).
  local url
  url="$(mysql_url)"
  if [ -z "$url" ]; then
    log "no MariaDB/MySQL at ${DELAYQ_MYSQL_HOST:-127.0.0.1}:${DELAYQ_MYSQL_PORT:-3306}: skipping its test run"
    return 0
  fi
  log "test suite on MariaDB/MySQL: what differs by database (${url}, $WORKERS processes)"
  DATABASE_URL="$url" "$PY" -m pytest "${PARALLEL[@]}" "${DATABASE_LEG[@]}" "$@"
  log "queue on its own database, MariaDB/MySQL (${url}_queue)"
  DATABASE_URL="$url" DELAYQ_TEST_QUEUE_URL="${url}_queue" \
    "$PY" -m pytest -q -p no:cacheprovider tests/queue_database tests/unit/test_routers.py
}

# -- the Django 6 leg: Python 3.12+ (Django 6 needs it) with django.tasks --------

VENV_DJ6="${VENV_DJ6:-.venv-dj6}"
# The main leg runs everything on Django 5.2 (with the django-tasks backport);
# this one keeps to what differs between the two: the Tasks backend on
# django.tasks, and a core subset (enqueue, worker, store) that meets
# Django's own changes and deprecations (warnings are errors); on PostgreSQL
# also the store's conformance suite, the worker, tests/unit, the admin's
# list and the tutorial followed on Django 6.1 (tests/docs/test_tutorial.py).
DJ6_TESTS=(
  tests/integration/test_tasks_backend.py tests/process/test_tasks_processes.py
  tests/integration/test_enqueue.py
)
DJ6_PG_TESTS=(
  tests/store tests/integration/test_worker.py tests/unit tests/admin/test_changelist.py
  tests/docs/test_tutorial.py
)

find_python_dj6() {
  # PYTHON_DJ6, else python3.12 / python3.13 on PATH, else a pyenv-installed 3.12+.
  local candidate version
  for candidate in "${PYTHON_DJ6:-}" python3.12 python3.13; do
    if [ -n "$candidate" ] &&
      "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null; then
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]\.[0-9]+$' | sort -V); do
      candidate="$(pyenv root)/versions/$version/bin/python3"
      if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
  fi
  return 1
}

ensure_django6_venv() {
  local python py6="$VENV_DJ6/bin/python"
  if ! python="$(find_python_dj6)"; then
    echo "Django 6 leg: no Python 3.12+ found (set PYTHON_DJ6=/path/to/python3.12)" >&2
    return 1
  fi
  if [ ! -x "$py6" ]; then
    log "creating $VENV_DJ6 with $("$python" --version)"
    "$python" -m venv "$VENV_DJ6"
  fi
  log "installing django-delayq with Django 6.x into $VENV_DJ6"
  "$py6" -m pip install -q --upgrade pip
  "$py6" -m pip install -q -e ".[postgres,test]" "Django>=6,<7"
}

run_django6() {
  local pg_url sqlite_url py6="$VENV_DJ6/bin/python"
  log "Django $("$py6" -m django --version) checks"
  DJANGO_SETTINGS_MODULE=tests.settings "$py6" -m django check
  DJANGO_SETTINGS_MODULE=tests.settings "$py6" -m django makemigrations --check --dry-run
  pg_url="$(scripts/ensure-postgres.sh)"
  sqlite_url="sqlite:///${TMPDIR:-/tmp}/delayq-dj6-$(id -u).sqlite3"
  log "Django 6: Tasks backend and core subset on PostgreSQL ($pg_url)"
  DATABASE_URL="$pg_url" "$py6" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" \
    "${DJ6_TESTS[@]}" "${DJ6_PG_TESTS[@]}"
  log "Django 6: Tasks backend and core subset on SQLite ($sqlite_url)"
  DATABASE_URL="$sqlite_url" "$py6" -m pytest -q -p no:cacheprovider "${PARALLEL[@]}" "${DJ6_TESTS[@]}"
}

case "${1:-}" in
  venv) ensure_full_venv; ensure_spark_runtime ;;
  test)
    shift; ensure_full_venv; ensure_chromium; ensure_spark_runtime; ensure_django6_venv
    installed=$SECONDS
    run_checks; run_docs; run_dist; run_suite "$@"; run_django6
    log "make test: installs $(minutes "$installed"), tests $(minutes $(( SECONDS - installed )))" ;;
  quick) shift; ensure_quick_venv; run_quick "$@" ;;
  coverage) shift; run_coverage "$@" ;;
  suite) shift; run_suite "$@" ;;
  pgbouncer) run_pgbouncer_suite "$(scripts/ensure-postgres.sh)" ;;
  dist) ensure_venv dist; run_dist ;;
  django6) ensure_django6_venv; run_django6 ;;
  # The example project runs on SQLite: Django, the app, django-environ and
  # (on Django 5.2) django-tasks, nothing else.
  demo) ensure_venv example; scripts/demo.sh "$PY" ;;
  # Sphinx, MyST and Furo, and the Tasks backport autodoc needs on Django 5.2.
  docs) ensure_venv docs,tasks; build_docs ;;
  *) echo "usage: $0 venv|test|quick|suite|coverage|pgbouncer|dist|docs|django6|demo" >&2; exit 2 ;;
esac
