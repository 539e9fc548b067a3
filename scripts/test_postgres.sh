#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster on loopback for the SQL buffer's Postgres tests and print
# its SQLAlchemy URL (CI: `export AGENTSCOPE_RFT_TEST_POSTGRES_URL=$(bash scripts/test_postgres.sh)`).
# Installs Debian's postgresql package when the server binaries are missing and apt is usable.
# Stop it with `bash scripts/test_postgres.sh stop`. Prints nothing (exit 1) if it cannot start.
set -euo pipefail
DIR=${AGENTSCOPE_RFT_PG_DIR:-/tmp/agentscope-rft-pg}
PORT=${AGENTSCOPE_RFT_PG_PORT:-55432}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)

as_owner() {  # the server refuses to run as root
    if [ "$(id -u)" = "0" ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}

if [ "${1:-}" = "stop" ]; then
    [ -n "$BIN" ] && as_owner "$BIN/pg_ctl -D $DIR/data -m fast stop" >/dev/null 2>&1 || true
    exit 0
fi
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
        echo "[postgres] installing Debian's postgresql" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) \
            >/dev/null 2>&1 || { echo "[postgres] install failed" >&2; exit 1; }
        BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    else
        echo "[postgres] no server binaries and cannot install them" >&2; exit 1
    fi
fi
if ! as_owner "$BIN/pg_ctl -D $DIR/data status" >/dev/null 2>&1; then
    rm -rf "$DIR"; mkdir -p "$DIR"
    [ "$(id -u)" = "0" ] && chown postgres "$DIR"
    as_owner "$BIN/initdb -D $DIR/data -U rft --auth=trust -E UTF8" >/dev/null
    as_owner "$BIN/pg_ctl -D $DIR/data -l $DIR/pg.log -w start -o \"-k $DIR -p $PORT \
        -c listen_addresses=127.0.0.1 -c fsync=off\"" >/dev/null
    as_owner "$BIN/createdb -h 127.0.0.1 -p $PORT -U rft rft_buffer_test"
fi
echo "postgresql+psycopg://rft@127.0.0.1:$PORT/rft_buffer_test"
