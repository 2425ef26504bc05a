#!/bin/sh
# Writes pgbouncer.ini from the environment and runs PgBouncer in transaction mode:
#   PGBOUNCER_DB_HOST, PGBOUNCER_DB_PORT [5432], PGBOUNCER_DB_NAME, PGBOUNCER_DB_USER, PGBOUNCER_DB_PASSWORD
#   PGBOUNCER_POOL_SIZE [20]: server connections per database and user
#   PGBOUNCER_MAX_CLIENT_CONN [2000]: client connections (every farm process's pools together)
set -eu
dir=$(mktemp -d)
umask 077
printf '"%s" "%s"\n' "${PGBOUNCER_DB_USER:?}" "${PGBOUNCER_DB_PASSWORD:?}" >"$dir/users.txt"
cat >"$dir/pgbouncer.ini" <<INI
[databases]
${PGBOUNCER_DB_NAME:?} = host=${PGBOUNCER_DB_HOST:?} port=${PGBOUNCER_DB_PORT:-5432} dbname=${PGBOUNCER_DB_NAME}

[pgbouncer]
listen_addr = 0.0.0.0
listen_port = 6432
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-20}
max_client_conn = ${PGBOUNCER_MAX_CLIENT_CONN:-2000}
INI
exec pgbouncer "$dir/pgbouncer.ini"
