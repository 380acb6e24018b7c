#!/usr/bin/env bash
# ensure-pgbouncer.sh — start a PgBouncer in transaction-pooling mode in front
# of the test PostgreSQL and print a DATABASE_URL that goes through it.
#
# Usage:
#   scripts/ensure-pgbouncer.sh [UPSTREAM_URL]   # (re)start it; print its URL (only stdout line)
#   scripts/ensure-pgbouncer.sh stop             # stop the one this script started
#
# UPSTREAM_URL defaults to what scripts/ensure-postgres.sh prints. The pooler
# is configured the way the deployment guide recommends for django-delayq
# (docs/howto/deployment.md, "PgBouncer"): pool_mode = transaction, a pool
# smaller than a worker's threads (default_pool_size = 2) so that every
# transaction really lands on whichever server connection is free, and the
# startup parameters psycopg sends ignored. Debian's pgbouncer package is
# installed with apt when missing (as root or through sudo). Every start is a
# fresh process with empty pools, so no server connection outlives a test run.
#
# Environment:
#   DELAYQ_PGBOUNCER_DIR   configuration, log and pid directory
#                          (default: ${TMPDIR:-/tmp}/delayq-pgbouncer-<uid>)
#   DELAYQ_PGBOUNCER_PORT  first port tried (default 6432; the next free one is used)
#   DELAYQ_PGBOUNCER_POOL  default_pool_size (default 2)
set -euo pipefail

# Callers capture stdout as the URL: everything else goes to stderr.
exec 3>&1 1>&2

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${DELAYQ_PGBOUNCER_DIR:-${TMPDIR:-/tmp}/delayq-pgbouncer-$(id -u)}"
PORT="${DELAYQ_PGBOUNCER_PORT:-6432}"
POOL="${DELAYQ_PGBOUNCER_POOL:-2}"
PIDFILE="$DIR/pgbouncer.pid"

log() { printf 'ensure-pgbouncer: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $*"; fi
}

find_pgbouncer() {
  command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; }
}

stop_running() {
  # Only the process recorded in this script's own pid file.
  local pid
  [ -f "$PIDFILE" ] || return 0
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && die "pgbouncer (pid $pid) did not stop"
  fi
  rm -f "$PIDFILE"
}

port_answers() {
  # Something accepts connections on 127.0.0.1:$1 (taken, or pgbouncer is up).
  python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.settimeout(0.5)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
}

if [ "${1:-}" = stop ]; then
  stop_running
  exit 0
fi

UPSTREAM="${1:-$("$REPO/scripts/ensure-postgres.sh")}"
# host, port, user, database name of the upstream URL
read -r UP_HOST UP_PORT UP_USER UP_DB < <(python3 - "$UPSTREAM" <<'EOF'
import sys
from urllib.parse import urlsplit
u = urlsplit(sys.argv[1])
print(u.hostname or "127.0.0.1", u.port or 5432, u.username or "postgres", u.path.lstrip("/") or "postgres")
EOF
)

BIN="$(find_pgbouncer || true)"
if [ -z "$BIN" ]; then
  log "installing Debian's pgbouncer"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer
  # The package starts a system instance on 6432: this script runs its own.
  as_root systemctl disable --now pgbouncer >/dev/null 2>&1 || true
  as_root service pgbouncer stop >/dev/null 2>&1 || true
  BIN="$(find_pgbouncer)" || die "pgbouncer is not installed"
fi

stop_running
mkdir -p "$DIR"
while port_answers "$PORT"; do PORT=$((PORT + 1)); done

# trust still needs the user in auth_file; no password is stored.
printf '"%s" ""\n' "$UP_USER" >"$DIR/userlist.txt"
cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
; every database name (the test runner creates test_<name>) goes upstream
* = host=$UP_HOST port=$UP_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
pool_mode = transaction
default_pool_size = $POOL
max_client_conn = 200
; psycopg sends extra_float_digits; libpq's options (-c ...) cannot be pooled
ignore_startup_parameters = extra_float_digits,options
logfile = $DIR/pgbouncer.log
pidfile = $PIDFILE
admin_users = $UP_USER
EOF

RUN_AS=()
if [ "$(id -u)" = 0 ]; then
  # pgbouncer refuses to run as root.
  id postgres >/dev/null 2>&1 || die "running as root and no postgres user to run pgbouncer as"
  chown -R postgres "$DIR"
  RUN_AS=(-u postgres)
fi
: >"$DIR/pgbouncer.log"
[ "$(id -u)" = 0 ] && chown postgres "$DIR/pgbouncer.log"
"$BIN" -d "${RUN_AS[@]}" "$DIR/pgbouncer.ini" 3>&- </dev/null >/dev/null 2>&1 || die "pgbouncer did not start (see $DIR/pgbouncer.log)"

URL="postgres://$UP_USER@127.0.0.1:$PORT/$UP_DB"
for _ in $(seq 100); do
  if port_answers "$PORT"; then
    log "pgbouncer $("$BIN" --version | head -1 | awk '{print $2}') (transaction pooling, pool $POOL) on 127.0.0.1:$PORT in front of $UP_HOST:$UP_PORT"
    printf '%s\n' "$URL" >&3
    exit 0
  fi
  sleep 0.1
done
die "pgbouncer is not accepting connections on $PORT (see $DIR/pgbouncer.log)"
