#!/bin/sh
# The part of the postgres image's entrypoint compose.yaml relies on: create the cluster
# on first start (superuser POSTGRES_USER with POSTGRES_PASSWORD, database POSTGRES_DB,
# password logins from other hosts), then run the server as the postgres user.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"

if [ "$(id -u)" = 0 ]; then
    install -d -o postgres -g postgres -m 0700 "$PGDATA"
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        postgres --single -D "$PGDATA" -c listen_addresses='' postgres >/dev/null <<SQL
CREATE DATABASE "$POSTGRES_DB";
SQL
    fi
fi
exec "$@"
