#!/bin/sh
# The contract of the postgres image that deploy/kubernetes/postgres.yaml
# relies on (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA; the
# server listening on all addresses, password auth), for the test image
# that deploy/kubernetes_test.go builds from this machine's Debian
# PostgreSQL: no registry is reachable here.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	pw="$(mktemp)"
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
	# As the official image: password auth over the network, trust on the
	# container's own socket.
	initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" --auth-host=scram-sha-256 --auth-local=trust \
		--no-locale -E UTF8 >/dev/null
	rm -f "$pw"
	echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
		psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
		pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
	fi
fi
exec "$@" -D "$PGDATA" -c listen_addresses='*'
