#!/usr/bin/env bash
# ensure-postgres.sh — make sure a PostgreSQL server is available for the
# django-delayq test suite and print a DATABASE_URL for it.
#
# Usage:
#   scripts/ensure-postgres.sh          # print a DATABASE_URL (only stdout line)
#   scripts/ensure-postgres.sh stop     # stop the throwaway cluster, if we made one
#
# Typical use:
#   export DATABASE_URL="$(scripts/ensure-postgres.sh)"
#
# Strategy, cheapest first:
#   1. Respect an explicit postgres DATABASE_URL from the environment.
#   2. Use a server already accepting trusted connections on 127.0.0.1:5432
#      (CI services, dev boxes).
#   3. Otherwise create (or reuse) a throwaway cluster in $PGDATA_DIR on
#      127.0.0.1:$PGPORT_LOCAL, installing PostgreSQL via apt when root.
#
# Environment:
#   DATABASE_URL          used as-is when it is a postgres:// or postgresql:// URL
#   DELAYQ_PG_PROBE_PORT  port probed in step 2 (default 5432; point it at an
#                         unused port to force step 3)
#   PGDATA_DIR            throwaway cluster directory (default: <repo>/.pgdata)
#   PGPORT_LOCAL          throwaway cluster port (default: 54329)
#   DELAYQ_PG_DEFAULTS    1: start the throwaway cluster with PostgreSQL's default
#                         settings instead of the test suite's fast, non-durable ones
set -euo pipefail

# Callers capture stdout as the URL, so every tool we run must write to stderr.
# Keep the real stdout on fd 3 and send everything else to stderr.
exec 3>&1 1>&2

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGDATA_DIR="${PGDATA_DIR:-$REPO/.pgdata}"
PGPORT_LOCAL="${PGPORT_LOCAL:-54329}"
PROBE_PORT="${DELAYQ_PG_PROBE_PORT:-5432}"
HOST=127.0.0.1
DB_NAME=delayq
# Marks a cluster as created by this script, so `stop` (and reuse) never
# touches a cluster somebody else owns, e.g. the system one.
MARKER="$PGDATA_DIR/delayq-throwaway-cluster"
LOGFILE="$PGDATA_DIR/server.log"

log() { printf 'ensure-postgres: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
emit_url() { printf '%s\n' "$1" >&3; exit 0; }

# Avoid hanging on a password prompt or a black-holed port.
export PGCONNECT_TIMEOUT=5

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# Locate a PostgreSQL client/server binary: next to the pg_ctl we picked (if
# any), then PATH, then the newest Debian/Ubuntu versioned bin dir (initdb and
# pg_ctl are not on PATH there).
PG_BIN=""
find_pg_tool() {
    local name="$1" candidate
    if [[ -n "$PG_BIN" && -x "$PG_BIN/$name" ]]; then
        echo "$PG_BIN/$name"; return 0
    fi
    if candidate="$(command -v "$name" 2>/dev/null)"; then
        echo "$candidate"; return 0
    fi
    candidate="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    if [[ -n "$candidate" && -x "$candidate/$name" ]]; then
        echo "$candidate/$name"; return 0
    fi
    return 1
}

# True when something accepts PostgreSQL (or at least TCP) connections.
# pg_isready speaks the protocol; the fallbacks only prove the port is open,
# which is why step 2 verifies with psql afterwards when it can.
port_accepts() {
    local host="$1" port="$2" isready
    if isready="$(find_pg_tool pg_isready)"; then
        "$isready" -q -h "$host" -p "$port" -t 3
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.close()' "$host" "$port" 2>/dev/null
    else
        (exec 9<>"/dev/tcp/$host/$port") 2>/dev/null
    fi
}

# Run psql against host/port as the postgres user, never prompting (-w).
psql_q() {
    local port="$1"; shift
    "$PSQL" -X -w -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$port" -U postgres -d postgres "$@"
}

# ---------------------------------------------------------------------------
# Throwaway-cluster plumbing (step 3 and `stop`)
# ---------------------------------------------------------------------------

# initdb/pg_ctl refuse to run as root, so as root we run them as an
# unprivileged OS user that owns the data directory.
# fd 3 (our real stdout) is closed for these commands: otherwise the
# postmaster started by pg_ctl inherits it and a caller doing
# "$(ensure-postgres.sh)" would wait for the server to exit.
PG_OS_USER=""
run_pg() {
    if [[ $EUID -ne 0 ]]; then
        "$@" 3>&-
    elif command -v runuser >/dev/null 2>&1; then
        # cd / so the unprivileged user is not left in an unreadable cwd.
        (cd / && runuser -u "$PG_OS_USER" -- "$@") 3>&-
    else
        (cd / && su "$PG_OS_USER" -s /bin/bash -c "$(printf '%q ' "$@")") 3>&-
    fi
}

# Set INITDB/PG_CTL (and PG_BIN so pg_isready/psql come from the same install).
find_server_tools() {
    local ctl
    ctl="$(find_pg_tool pg_ctl)" || return 1
    PG_BIN="$(dirname "$(readlink -f "$ctl")")"
    PG_CTL="$ctl"
    INITDB="$(find_pg_tool initdb)" || return 1
}

# pg_ctl status: 0 = running, 3 = not running, 4 = no usable data dir.
cluster_running() {
    local rc=0
    run_pg "$PG_CTL" status -D "$PGDATA_DIR" >/dev/null 2>&1 || rc=$?
    [[ $rc -eq 0 ]]
}

# When root, reuse whoever already owns an existing cluster.
pick_os_user_for_existing() {
    [[ $EUID -eq 0 ]] || return 0
    PG_OS_USER="$(stat -c %U "$PGDATA_DIR")"
    [[ "$PG_OS_USER" != root ]] \
        || die "$PGDATA_DIR is owned by root; PostgreSQL cannot run as root. Remove it and retry."
}

# When root and creating a cluster: prefer the distro's `postgres` user, else
# make a dedicated system user.
pick_os_user_for_new() {
    [[ $EUID -eq 0 ]] || return 0
    if id -u postgres >/dev/null 2>&1; then
        PG_OS_USER=postgres
    else
        if ! id -u delayqpg >/dev/null 2>&1; then
            log "creating system user delayqpg to own the throwaway cluster"
            useradd -r -M -s /usr/sbin/nologin delayqpg \
                || die "could not create system user delayqpg"
        fi
        PG_OS_USER=delayqpg
    fi
}

do_stop() {
    if [[ ! -f "$PGDATA_DIR/PG_VERSION" || ! -f "$MARKER" ]]; then
        log "no throwaway cluster in $PGDATA_DIR; nothing to stop"
        return 0
    fi
    find_server_tools || die "pg_ctl not found; cannot stop the cluster in $PGDATA_DIR"
    pick_os_user_for_existing
    if cluster_running; then
        log "stopping throwaway cluster in $PGDATA_DIR"
        run_pg "$PG_CTL" stop -D "$PGDATA_DIR" -m fast -w -t 30 >&2
    else
        log "throwaway cluster in $PGDATA_DIR is not running"
    fi
}

# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------

case "${1:-}" in
    "") ;;
    stop) do_stop; exit 0 ;;
    *) die "usage: $0 [stop]" ;;
esac

# --- Step 1: an explicit postgres DATABASE_URL wins. ------------------------
if [[ -n "${DATABASE_URL:-}" ]]; then
    case "$DATABASE_URL" in
        postgres://*|postgresql://*)
            log "using DATABASE_URL from the environment"
            emit_url "$DATABASE_URL" ;;
        *)
            log "ignoring non-PostgreSQL DATABASE_URL from the environment" ;;
    esac
fi

# --- Step 2: an existing trusted server on 127.0.0.1:$PROBE_PORT. -----------
if port_accepts "$HOST" "$PROBE_PORT"; then
    if PSQL="$(find_pg_tool psql)"; then
        if psql_q "$PROBE_PORT" -c 'select 1' >/dev/null 2>&1; then
            # pytest-django creates test_delayq itself, so the role needs
            # CREATEDB (superuser implies it); grant it if missing.
            can_create="$(psql_q "$PROBE_PORT" -At -c \
                "select rolsuper or rolcreatedb from pg_roles where rolname = current_user")"
            if [[ "$can_create" != t ]]; then
                log "granting CREATEDB to role postgres on port $PROBE_PORT"
                psql_q "$PROBE_PORT" -c 'alter role postgres createdb' >/dev/null 2>&1 \
                    && can_create=t
            fi
            if [[ "$can_create" == t ]]; then
                log "using existing PostgreSQL on $HOST:$PROBE_PORT"
                emit_url "postgres://postgres@$HOST:$PROBE_PORT/$DB_NAME"
            fi
            log "role postgres on $HOST:$PROBE_PORT cannot create databases; provisioning our own"
        else
            log "$HOST:$PROBE_PORT does not accept trusted logins as postgres; provisioning our own"
        fi
    else
        # No psql to double-check with: trust the probe.
        log "using existing PostgreSQL on $HOST:$PROBE_PORT (not verified: psql missing)"
        emit_url "postgres://postgres@$HOST:$PROBE_PORT/$DB_NAME"
    fi
else
    log "no PostgreSQL on $HOST:$PROBE_PORT; provisioning a throwaway cluster"
fi

# --- Step 3: a throwaway cluster in $PGDATA_DIR. ----------------------------
if ! find_server_tools; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "initdb/pg_ctl not found; installing postgresql with apt-get"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        find_server_tools || die "postgresql installed but initdb/pg_ctl still not found"
    else
        die "PostgreSQL server binaries (initdb, pg_ctl) not found. Install PostgreSQL" \
            "(e.g. 'apt-get install postgresql') or set DATABASE_URL=postgres://..."
    fi
fi
log "using PostgreSQL binaries from $PG_BIN"
PSQL="$(find_pg_tool psql || true)"

if [[ -f "$PGDATA_DIR/PG_VERSION" ]]; then
    # Never adopt a cluster we did not create (it could be someone's real data).
    [[ -f "$MARKER" ]] \
        || die "$PGDATA_DIR holds a PostgreSQL cluster not created by this script; choose another PGDATA_DIR"
    pick_os_user_for_existing
else
    pick_os_user_for_new
    mkdir -p "$PGDATA_DIR"
    if [[ -n "$(ls -A "$PGDATA_DIR")" ]]; then
        die "$PGDATA_DIR exists, is not empty and is not a PostgreSQL cluster"
    fi
    # PostgreSQL insists on a private data dir owned by the server user.
    chmod 700 "$PGDATA_DIR"
    if [[ $EUID -eq 0 ]]; then
        chown "$PG_OS_USER:" "$PGDATA_DIR"
        # Every parent must be traversable by that user, or initdb fails obscurely.
        run_pg test -x "$PGDATA_DIR" \
            || die "user $PG_OS_USER cannot reach $PGDATA_DIR (check parent directory permissions)"
    fi
    log "initialising throwaway cluster in $PGDATA_DIR"
    # trust auth + superuser `postgres`: matches the URL we print; C locale and
    # UTF8 work on minimal images; --no-sync because the data is disposable.
    run_pg "$INITDB" -D "$PGDATA_DIR" -U postgres -A trust -E UTF8 --locale=C --no-sync >&2
    run_pg touch "$MARKER"
fi

port="$PGPORT_LOCAL"
if cluster_running; then
    # Reuse; report the port it actually listens on (line 4 of postmaster.pid),
    # which differs from PGPORT_LOCAL if that changed since it was started.
    running_port="$(sed -n 4p "$PGDATA_DIR/postmaster.pid" 2>/dev/null || true)"
    if [[ -n "$running_port" && "$running_port" != "$port" ]]; then
        log "cluster already running on port $running_port (not $port); using it"
        port="$running_port"
    else
        log "reusing running throwaway cluster on port $port"
    fi
else
    if port_accepts "$HOST" "$port"; then
        die "port $port is taken by another server; set PGPORT_LOCAL to a free port"
    fi
    # The unix socket lives in the data dir (no /var/run permissions needed),
    # unless the path would exceed the ~107-byte socket path limit; tests use
    # TCP anyway, so then we simply go TCP-only.
    sockdir="$PGDATA_DIR"
    if (( ${#PGDATA_DIR} + 20 > 107 )); then
        log "data dir path too long for a unix socket; listening on TCP only"
        sockdir=""
    fi
    # Settings go on the command line rather than into postgresql.conf so a
    # changed PGPORT_LOCAL takes effect on the next start. fsync & co. off:
    # throwaway data, speed matters; 200 connections for parallel test workers.
    # DELAYQ_PG_DEFAULTS=1 keeps PostgreSQL's own defaults (make soak).
    opts="-c listen_addresses=$HOST -p $port -k '$sockdir'"
    if [[ "${DELAYQ_PG_DEFAULTS:-}" != 1 ]]; then
        opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        opts+=" -c max_connections=200 -c shared_buffers=32MB"
    fi
    log "starting throwaway cluster on $HOST:$port (log: $LOGFILE)"
    # -W: don't let pg_ctl wait; we wait below with our own deadline.
    run_pg "$PG_CTL" start -D "$PGDATA_DIR" -l "$LOGFILE" -W -o "$opts" >&2
fi

# Wait (max 30 s) until the server accepts connections.
deadline=$((SECONDS + 30))
started=$SECONDS
until port_accepts "$HOST" "$port"; do
    # Fail fast if the postmaster already died (bad option, port race, ...)
    # instead of sitting out the whole deadline; give it 2 s to write its pid.
    if (( SECONDS - started >= 2 )) && ! cluster_running; then
        log "server exited during startup; last log lines:"
        tail -n 20 "$LOGFILE" >&2 2>/dev/null || true
        die "throwaway PostgreSQL failed to start"
    fi
    if (( SECONDS >= deadline )); then
        log "server did not become ready within 30 s; last log lines:"
        tail -n 20 "$LOGFILE" >&2 2>/dev/null || true
        die "throwaway PostgreSQL failed to start"
    fi
    sleep 0.5
done

if [[ -n "$PSQL" ]]; then
    psql_q "$port" -c 'select 1' >/dev/null \
        || die "throwaway cluster on port $port is up but rejects postgres logins"
fi
log "throwaway cluster ready on $HOST:$port"
emit_url "postgres://postgres@$HOST:$port/$DB_NAME"
