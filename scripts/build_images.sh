#!/usr/bin/env bash
# Build every image docker-compose.yml needs without a container registry (NOTES: Containers):
#   - a local Debian base (scripts/build_base_image.sh; kept once built),
#   - rollout-farm:latest from the Dockerfile on that base, with every Python wheel downloaded here first
#     into the build context (docker/wheels/; torch is the CPU wheel pip already finds on this machine),
#   - PostgreSQL and Redis images honouring the official images' contract (docker/postgres, docker/redis),
#   - Debian's PgBouncer for docker-compose.pgbouncer.yml (docker/pgbouncer).
# Then print the variables docker-compose.yml reads to use them.
#
#   scripts/build_images.sh > compose.env && set -a && . ./compose.env && set +a
#   FARM_API_TOKEN=... docker-compose up -d
#
# Docker's layer cache makes a second build quick (seconds when only farm/ or tasks/ changed).
# Progress goes to stderr, the variables to stdout. Needs a running Docker engine (scripts/setup_docker.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

docker=/usr/bin/docker
# shellcheck source=/dev/null
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
base="${FARM_COMPOSE_BASE_IMAGE:-rollout-farm-base:$codename}"
postgres_image=rollout-farm-postgres:15
redis_image=rollout-farm-redis:7
pgbouncer_image=rollout-farm-pgbouncer:1.18
torch_spec="torch==2.13.0"
logs=$(mktemp -d /tmp/rollout-farm-build.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# The Python wheels the image installs, downloaded here (torch's CPU wheel is the one pip already finds on
# this machine; download.pytorch.org is not reachable), while debootstrap makes the base image.
# pip runs under Debian's own python3: the image's interpreter (the base is this machine's release), so
# environment markers (python_full_version < "3.11.3": async-timeout) resolve as they will in the image.
python=/usr/bin/python3
"$python" -m pip --version >/dev/null 2>&1 || { echo "$python has no pip: apt-get install python3-pip" >&2; exit 1; }
mkdir -p docker/wheels
"$python" docker/deps.py pyproject.toml server llm sandbox tasks >"$logs/requirements.txt"
"$python" -m pip download --quiet --disable-pip-version-check -d docker/wheels \
    "$torch_spec" hatchling -r "$logs/requirements.txt" >"$logs/wheels.log" 2>&1 &
wheels_pid=$!
scripts/build_base_image.sh "$base" >&2
wait "$wheels_pid" || { echo "pip download failed:" >&2; tail -n 30 "$logs/wheels.log" >&2; exit 1; }
echo "wheels in docker/wheels/ ($(find docker/wheels -name '*.whl' | wc -l))" >&2

build() {  # build NAME CONTEXT [DOCKERFILE]: quiet unless it fails
    local name=$1 context=$2 log="$logs/${1//[:\/]/_}.log"
    if ! "$docker" build --force-rm --build-arg "BASE_IMAGE=$base" -t "$name" "$context" >"$log" 2>&1; then
        echo "building $name failed:" >&2
        tail -n 40 "$log" >&2
        return 1
    fi
    echo "$name built" >&2
}

# PostgreSQL and Redis build (mostly apt downloads) while the farm image installs its Python packages.
echo "building rollout-farm:latest, $postgres_image, $redis_image and $pgbouncer_image on $base" >&2
build "$postgres_image" docker/postgres &
postgres_pid=$!
build "$redis_image" docker/redis &
redis_pid=$!
build "$pgbouncer_image" docker/pgbouncer &
pgbouncer_pid=$!
status=0
build rollout-farm:latest . || status=1
wait "$postgres_pid" || status=1
wait "$redis_pid" || status=1
wait "$pgbouncer_pid" || status=1
((status == 0)) || exit 1

echo "FARM_COMPOSE_BASE_IMAGE=$base"
echo "FARM_COMPOSE_POSTGRES_IMAGE=$postgres_image"
echo "FARM_COMPOSE_REDIS_IMAGE=$redis_image"
echo "FARM_COMPOSE_PGBOUNCER_IMAGE=$pgbouncer_image"
