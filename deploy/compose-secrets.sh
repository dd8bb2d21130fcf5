#!/usr/bin/env bash
# Make the secret files docker-compose.yml mounts, once: a random Postgres
# password, the database URL that carries it, and a master key. Existing
# files are kept (a new master key would orphan every sealed secret).
#
# Compose mounts these files into the containers as they are, so they must
# be readable by the containers' users (postgres, and uid 65532 for
# tessera): they are made 0444 in a folder only you can enter (0700).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p -m 0700 secrets
make() {
    local name=$1 value=$2
    if [[ -e secrets/$name ]]; then
        echo "secrets/$name exists; kept"
        return
    fi
    (umask 0333 && printf '%s\n' "$value" > "secrets/$name")
    echo "secrets/$name written"
}
password=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
if [[ -e secrets/postgres_password ]]; then
    password=$(cat secrets/postgres_password)
fi
make postgres_password "$password"
make database_url "postgres://tessera:${password}@postgres:5432/tessera"
make master_key "$(head -c 32 /dev/urandom | base64)"
