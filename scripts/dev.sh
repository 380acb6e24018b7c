#!/usr/bin/env bash
# One entry point for the project's jobs; the Makefile targets call it.
#
#   scripts/dev.sh venv    create .venv and install the package with its extras
#   scripts/dev.sh test    lint, checks, then the whole suite on PostgreSQL and SQLite
#   scripts/dev.sh demo    run the example project on its SQLite default
#
# Works on a fresh Debian machine with Python 3.11+: what is missing (the
# venv module, a PostgreSQL server) is installed when running as root.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"

log() { printf '\n==> %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

ensure_venv() {
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
  log "installing django-delayq and its test dependencies"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e ".[postgres,test,example,dev,spark]"
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
  # queue table through Debian's JDBC drivers (nothing comes from Maven).
  local missing=() version
  version="$("${JAVA_HOME:+$JAVA_HOME/bin/}java" -version 2>&1 || true)"
  grep -Eq 'version "(1[7-9]|[2-9][0-9])' <<<"$version" || missing+=(openjdk-17-jre-headless)
  [ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
  [ -f /usr/share/java/sqlite-jdbc.jar ] || missing+=(libxerial-sqlite-jdbc-java)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]} for the Spark data pipeline"
    apt_install "${missing[@]}"
  fi
}

run_checks() {
  log "lint and Django checks"
  "$VENV/bin/ruff" check django_delayq tests example_project benchmarks
  "$VENV/bin/mypy" django_delayq
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django check
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django makemigrations --check --dry-run
}

run_suite() {
  local pg_url sqlite_url
  pg_url="$(scripts/ensure-postgres.sh)"
  sqlite_url="sqlite:///${TMPDIR:-/tmp}/delayq-suite-$(id -u).sqlite3"
  log "test suite on PostgreSQL ($pg_url)"
  DATABASE_URL="$pg_url" "$PY" -m pytest "$@"
  log "test suite on SQLite ($sqlite_url)"
  DATABASE_URL="$sqlite_url" "$PY" -m pytest "$@"
}

case "${1:-}" in
  venv) ensure_venv; ensure_spark_runtime ;;
  test) shift; ensure_venv; ensure_chromium; ensure_spark_runtime; run_checks; run_suite "$@" ;;
  suite) shift; run_suite "$@" ;;
  demo) ensure_venv; scripts/demo.sh "$PY" ;;
  *) echo "usage: $0 venv|test|suite|demo" >&2; exit 2 ;;
esac
