# PostgreSQL 15 server binaries: tests start throwaway clusters on loopback
# with initdb/pg_ctl as the postgres user.
need_apt postgresql-15
