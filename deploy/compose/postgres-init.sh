#!/bin/sh
# Run once by the postgres image, on an empty data directory
# (/docker-entrypoint-initdb.d, as the postgres user): the login role the
# nodes connect as, not a superuser, and one database per region that it
# owns. The nodes create and migrate their schema ("cascade") themselves.
set -e
psql --set=ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  --set=password="$(cat "$CASCADE_PASSWORD_FILE")" <<'SQL'
CREATE ROLE cascade LOGIN PASSWORD :'password';
CREATE DATABASE cascade_eu_west OWNER cascade;
CREATE DATABASE cascade_us_east OWNER cascade;
CREATE DATABASE cascade_ap_south OWNER cascade;
SQL
