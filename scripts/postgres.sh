#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests of crates/fence, which need a real
# one. Prints one line on stdout, for eval; everything else goes to stderr:
#
#   eval "$(scripts/postgres.sh)"   # start (or reuse) the server; exports
#                                   # DEADBOLT_TEST_POSTGRES_URL=postgres://deadbolt:…@127.0.0.1:PORT/deadbolt_test
#   scripts/postgres.sh stop        # stop it and delete its data
#
# What it does:
#   1. finds initdb/pg_ctl/pg_isready/psql on PATH or in /usr/lib/postgresql/<ver>/bin
#      (Debian's place, not on PATH); if there are none and we are root, installs Debian's
#      `postgresql` package with apt-get (running `apt-get update` first only when apt
#      does not know the package yet);
#   2. initdb's a fresh cluster in $DEADBOLT_PG_DIR/data, owned by the `postgres` user
#      when we are root (the server refuses to run as root), by us otherwise;
#   3. starts it on the first free port from 54329 on, listening on 127.0.0.1 only,
#      with password (SCRAM) authentication: the superuser `deadbolt` has a random
#      password kept in $DEADBOLT_PG_DIR/password (mode 0600), so other local users
#      cannot get in; and with fsync off, since the data is thrown away;
#   4. waits (bounded) until it accepts connections, creates database deadbolt_test.
# A second run finds the server running (or restarts it on the same data) and only
# prints the line again. Nothing waits unbounded: apt-get, the server start and every
# connection attempt have time limits.
#
# env: DEADBOLT_PG_DIR   where the server lives (default: /tmp/deadbolt-pg)
set -euo pipefail

DIR=${DEADBOLT_PG_DIR:-/tmp/deadbolt-pg}
DATA=$DIR/data
DB=deadbolt_test
SUPERUSER=deadbolt
FIRST_PORT=54329
PORT_TRIES=100

log() { echo "postgres.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/apt-install.sh
source "$(dirname "$0")/apt-install.sh"

if [[ $(id -u) == 0 ]]; then
    # PostgreSQL refuses to run as root; Debian's package creates this user.
    OWNER=postgres
else
    OWNER=$(id -un)
fi

# Runs a command as the owner of the cluster, from / (the owner may not be allowed
# into the caller's working directory, and initdb/pg_ctl complain about that), without
# our lock's descriptor: the server would inherit it and hold the lock forever.
as_owner() {
    if [[ $(id -u) == 0 ]]; then
        (cd / && runuser -u "$OWNER" -- "$@") 9>&-
    else
        (cd / && "$@") 9>&-
    fi
}

# The first directory that holds every program we need: PATH first (resolving
# symlinks, so psql is the real one and not Debian's version-picking wrapper),
# then Debian's versioned directories, newest first.
find_pgbin() {
    local candidates=() dir tool ok
    if command -v pg_ctl >/dev/null 2>&1; then
        candidates+=("$(dirname "$(readlink -f "$(command -v pg_ctl)")")")
    fi
    while IFS= read -r dir; do
        candidates+=("$dir")
    done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV)
    for dir in ${candidates[@]+"${candidates[@]}"}; do
        ok=1
        for tool in initdb pg_ctl pg_isready psql postgres; do
            [[ -x $dir/$tool ]] || ok=0
        done
        if [[ $ok == 1 ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}


port_in_use() {
    # Anything accepting a TCP connection there, ours or not.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() {
    local port
    for ((port = FIRST_PORT; port < FIRST_PORT + PORT_TRIES; port++)); do
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    die "no free port in $FIRST_PORT..$((FIRST_PORT + PORT_TRIES - 1))"
}

url() {
    echo "postgres://$SUPERUSER:$(cat "$DIR/password")@127.0.0.1:$(cat "$DIR/port")/$DB"
}

# True if our server answers on the recorded port and takes our password: that
# tells it apart from some other server that took the port since.
answers() {
    [[ -f $DIR/port && -f $DIR/password ]] || return 1
    PGPASSWORD=$(cat "$DIR/password") PGCONNECT_TIMEOUT=5 timeout 15 \
        "$PGBIN/psql" -h 127.0.0.1 -p "$(cat "$DIR/port")" -U "$SUPERUSER" -d "$1" \
        -X -q -t -c 'SELECT 1' >/dev/null 2>&1
}

stop_server() {
    if [[ -f $DATA/postmaster.pid ]]; then
        as_owner timeout 60 "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >&2 || true
    fi
}

start_server() {
    local port
    port=$(free_port)
    echo "$port" >"$DIR/port"
    log "starting the server on 127.0.0.1:$port (log: $DIR/server.log)"
    as_owner timeout 60 "$PGBIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 30 \
        -o "-p $port" start >&2 || {
        tail -n 20 "$DIR/server.log" >&2 2>/dev/null || true
        return 1
    }
    # pg_ctl -w waited for the socket; wait for the TCP side the tests use too.
    local deadline=$((SECONDS + 30))
    until timeout 10 "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" -t 5; do
        ((SECONDS < deadline)) || {
            log "the server did not accept connections on 127.0.0.1:$port within 30 s"
            return 1
        }
        sleep 0.2
    done
}

init_cluster() {
    stop_server
    rm -rf "$DIR"
    mkdir -m 0700 "$DIR"
    chown "$OWNER" "$DIR"
    # 32 hex digits: strong enough, and needs no escaping in a URL.
    od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$DIR/password"
    chmod 0600 "$DIR/password"
    chown "$OWNER" "$DIR/password"
    log "initdb $DATA (as $OWNER)"
    # --no-sync and fsync=off: this cluster is thrown away, durability buys nothing.
    as_owner timeout 120 "$PGBIN/initdb" -D "$DATA" -U "$SUPERUSER" --pwfile="$DIR/password" \
        --auth=scram-sha-256 -E UTF8 --no-locale --no-sync >"$DIR/initdb.log" 2>&1 || {
        cat "$DIR/initdb.log" >&2
        die "initdb failed"
    }
    cat >>"$DATA/postgresql.conf" <<EOF

# scripts/postgres.sh: a throwaway server for the tests.
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 100
EOF
    start_server || die "could not start the server"
    PGPASSWORD=$(cat "$DIR/password") PGCONNECT_TIMEOUT=5 timeout 30 \
        "$PGBIN/psql" -h 127.0.0.1 -p "$(cat "$DIR/port")" -U "$SUPERUSER" -d postgres \
        -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >&2 || die "could not create database $DB"
    touch "$DIR/ready"
}

main() {
    local cmd=${1:-start}
    case $cmd in
        start | stop) ;;
        *) die "usage: $0 [start|stop]" ;;
    esac

    # One run at a time: two concurrent first runs would both initdb the same directory.
    exec 9>"$DIR.lock"
    flock -w 300 9 || die "another scripts/postgres.sh has held $DIR.lock for 5 minutes"

    if [[ -e $DIR && $(stat -c %U "$DIR") != "$OWNER" ]]; then
        die "$DIR exists and belongs to $(stat -c %U "$DIR"), not $OWNER; remove it or set DEADBOLT_PG_DIR"
    fi

    if ! PGBIN=$(find_pgbin); then
        [[ $cmd == stop ]] && { rm -rf "$DIR"; return 0; }
        apt_install postgresql "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin)"
        PGBIN=$(find_pgbin) || die "installed postgresql but found no initdb/pg_ctl in /usr/lib/postgresql/*/bin"
    fi

    if [[ $cmd == stop ]]; then
        stop_server
        rm -rf "$DIR"
        log "stopped; removed $DIR"
        return 0
    fi

    if [[ -f $DIR/ready ]] && answers "$DB"; then
        log "reusing the server on 127.0.0.1:$(cat "$DIR/port") ($DIR)"
    elif [[ -f $DIR/ready ]] && { stop_server; start_server; } && answers "$DB"; then
        log "restarted the server in $DIR"
    else
        local started=$SECONDS
        init_cluster
        log "new server ready in $((SECONDS - started)) s ($("$PGBIN/postgres" --version))"
    fi
    echo "export DEADBOLT_TEST_POSTGRES_URL=$(url)"
}

main "$@"
