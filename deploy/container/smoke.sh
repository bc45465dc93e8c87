#!/usr/bin/env bash
# Run deploy/compose.yaml (PostgreSQL, two nodes, Prometheus, and the single-node profile)
# with podman-compose or docker compose, prove it works, and take it all down again.
#   bash deploy/container/build.sh && bash deploy/container/smoke.sh
# Every container is on the host's network, listening on 127.0.0.1 only, on ports of its own
# (compose.host.yaml: 25432, 28080-28082, 29090), so nothing leaves loopback and a
# PostgreSQL of the machine's own on 5432 is left alone. When postgres:15 and
# prom/prometheus cannot be pulled, stand-ins are built from Debian's packages
# (postgresql-15, prometheus) and tagged with those names. Prints one summary line; exits
# non-zero on any failure. Logs: ~/.cache/goqueue-container/smoke.log.
set -euo pipefail
# shellcheck source=deploy/container/lib.sh
. "$(dirname "$0")/lib.sh"

# One stack at a time on a machine: the ports and the project name are fixed.
exec 9>"$CACHE/smoke.lock"
flock -w 900 9 || die "another smoke.sh still runs after 15 minutes"

PROJECT=goqueue-smoke
PG_IMAGE=docker.io/library/postgres:15
PROM_IMAGE=docker.io/prom/prometheus:v2.53.0
NODE1=http://127.0.0.1:28081
NODE2=http://127.0.0.1:28082
SINGLE=http://127.0.0.1:28080
PROMETHEUS=http://127.0.0.1:29090
LOG="$CACHE/smoke.log"
CHECKS="$HERE/smoke_checks.py"
GOQUEUE_API_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
export GOQUEUE_API_KEY  # compose.yaml's ${GOQUEUE_API_KEY}; the environment beats deploy/.env
started=$SECONDS
step="setup"
passed=()
: >"$LOG"

compose() { "${COMPOSE[@]}" "$@" >>"$LOG" 2>&1; }
# The container of a compose service (podman-compose labels its containers as docker does).
container() {
    "$ENGINE" ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -n1
}
check() {
    local name="$1"
    shift
    step="$name"
    say "check: $name"
    python3 "$CHECKS" "$@" 2> >(tee -a "$LOG" >&2)
    passed+=("$name")
}

teardown() {
    local status=$? took=$((SECONDS - started))
    trap - EXIT
    if [ "$status" -ne 0 ] && [ -n "${COMPOSE[*]:-}" ]; then
        for service in node1 node2 single postgres prometheus; do
            ctr="$(container "$service" 2>/dev/null || true)"
            [ -n "$ctr" ] || continue
            { echo "--- $service" && "$ENGINE" logs --tail 30 "$ctr"; } >>"$LOG" 2>&1
        done
    fi
    # This project's containers with their anonymous volumes (the images' VOLUME /data and
    # /prometheus, which `down -v` leaves), dependents first (podman refuses to remove a
    # container another depends on); then its named volumes and anything else `down`
    # removes; then whatever a failed `down` left behind.
    local remove=("$ENGINE" rm -f -v)
    [ "$ENGINE" = podman ] && remove+=(-t 5)  # docker's rm kills at once, and has no -t
    for service in prometheus single node1 node2 postgres; do
        "$ENGINE" ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
            --filter "label=com.docker.compose.service=$service" \
            | xargs -r "${remove[@]}" >>"$LOG" 2>&1 || true
    done
    if [ -n "${COMPOSE[*]:-}" ]; then
        compose --profile single down -v -t 5 || true
    fi
    "$ENGINE" volume ls -q --filter "label=com.docker.compose.project=$PROJECT" \
        | xargs -r "$ENGINE" volume rm -f >>"$LOG" 2>&1 || true
    if [ "$status" -eq 0 ]; then
        echo "smoke: OK in ${took} s, ${#passed[@]} checks passed (${passed[*]})"
    else
        echo "smoke: FAILED at '$step' after ${took} s," \
            "passed before it: ${passed[*]:-none} (log: $LOG)"
    fi
    exit "$status"
}
trap teardown EXIT

# PostgreSQL and Prometheus: pulled, or built from Debian's packages under the same names.
# A stand-in carries a label with the hash of its Containerfile and files, and is built
# again when they change (on the cached root file system, in seconds).
service_image() {
    local image="$1" name="$2" packages="$3" recipe seen old
    shift 3
    recipe="$(cat "$HERE/images/$name"[.-]* | sha256sum | cut -c1-16)"
    seen="$("$ENGINE" image inspect --format '{{index .Labels "goqueue.stand-in"}}' \
        "$image" 2>/dev/null)" || seen=missing
    [ "$seen" = "$recipe" ] && return 0
    if [ "$seen" = missing ] || [ "$seen" = "<no value>" ] || [ -z "$seen" ]; then
        pull "$image" && return 0
        say "cannot pull $image; building a stand-in from Debian's $packages"
    fi
    debian_rootfs "localhost/goqueue-rootfs-$name:$SUITE" "$packages" "$@"
    old="$(image_id "$image")"
    "$ENGINE" build -q --network none --build-arg ROOTFS="localhost/goqueue-rootfs-$name:$SUITE" \
        --label "org.opencontainers.image.description=$name from Debian $SUITE packages" \
        --label "goqueue.stand-in=$recipe" \
        -f "$HERE/images/$name.Containerfile" -t "$image" "$HERE/images" >/dev/null
    [ -z "$old" ] || "$ENGINE" rmi "$old" >/dev/null 2>&1 || true  # the stand-in replaced
}

pick_engine
have_image "$IMAGE" || die "no $IMAGE here: run deploy/container/build.sh first"
podman_config "$IMAGE"
for port in 25432 28080 28081 28082 29090; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "127.0.0.1:$port is taken; the stack needs it (see compose.host.yaml)"
    fi
done

step="images"
# The cluster postgresql-15's install creates is not used: the entrypoint makes its own.
# shellcheck disable=SC2016  # $1 is mmdebstrap's, the root being built
service_image "$PG_IMAGE" postgres postgresql-15 \
    --customize-hook='rm -rf "$1/var/lib/postgresql/15" "$1/etc/postgresql/15"'
service_image "$PROM_IMAGE" prometheus prometheus
if [ "$ENGINE" = podman ]; then
    # Pinned, as the project pins its linters: the version these checks were proven with.
    tools_venv
    pinned=1.6.0
    installed="$("$TOOLS/bin/python" -c \
        'import importlib.metadata as m; print(m.version("podman-compose"))' 2>/dev/null || true)"
    [ "$installed" = "$pinned" ] \
        || "$TOOLS/bin/pip" install -q "podman-compose==$pinned" >>"$LOG" 2>&1
    COMPOSE=("$TOOLS/bin/podman-compose")
else
    docker compose version >/dev/null 2>&1 || die "docker compose (the plugin) is missing"
    COMPOSE=(docker compose)
fi
COMPOSE+=(-p "$PROJECT" -f "$ROOT/deploy/compose.yaml" -f "$HERE/compose.host.yaml")
passed+=(images)

# PostgreSQL first and healthy, then the rest (podman-compose cannot wait for a healthcheck
# with podman before 4.6).
step="up"
say "starting PostgreSQL, two nodes and Prometheus"
compose up -d --no-build postgres
for _ in $(seq 1 60); do
    "$ENGINE" exec "$(container postgres)" pg_isready -q -U goqueue -d goqueue && break
    sleep 0.5
done
"$ENGINE" exec "$(container postgres)" pg_isready -q -U goqueue -d goqueue
compose up -d --no-build node1 node2 prometheus
passed+=(up)

check ready ready "$NODE1" "$NODE2"

# The image's HEALTHCHECK and compose's for PostgreSQL. podman runs healthchecks from
# systemd timers, absent on some hosts, so each is run once here; docker runs its own.
step="healthcheck"
say "check: healthcheck"
for service in node1 node2 postgres; do
    if [ "$ENGINE" = podman ]; then
        podman healthcheck run "$(container "$service")" >>"$LOG" 2>&1 \
            || die "$service: its healthcheck fails"
    else
        for _ in $(seq 1 60); do
            health="$(docker inspect --format '{{.State.Health.Status}}' "$(container "$service")")"
            [ "$health" = healthy ] && break
            sleep 1
        done
        [ "$health" = healthy ] || die "$service: its health is $health"
    fi
done
echo "healthcheck: node1, node2 and postgres healthy" | tee -a "$LOG" >&2
passed+=(healthcheck)
check exactly-once exactly-once --count 200 "$NODE1" "$NODE2"
check cancel cancel --node node1 "$NODE1" --node node2 "$NODE2"
check prometheus targets "$PROMETHEUS" --expect 2
# GOQUEUE_SHUTDOWN_GRACE and stop_grace_period in compose.yaml. podman-compose applies the
# latter to its own stop and down only, so the engine's stop is given it here.
check drain drain --engine "$ENGINE" --grace 30 --stop-timeout 45 \
    --node node1 "$NODE1" --node node2 "$NODE2" \
    --container node1 "$(container node1)" --container node2 "$(container node2)"

# One node on the image's defaults (no DATABASE_URL: the SQLite file in /data, a volume):
# a job it ran is still there in a new container on the same volume.
step="sqlite"
say "check: sqlite (single node on the /data volume, container replaced)"
compose --profile single up -d --no-build single
python3 "$CHECKS" ready "$SINGLE" 2>>"$LOG"
job_id="$(python3 "$CHECKS" put "$SINGLE" 2>>"$LOG")"
first="$(container single)"
"$ENGINE" stop "$first" >>"$LOG" 2>&1 && "$ENGINE" rm -v "$first" >>"$LOG" 2>&1
compose --profile single up -d --no-build single
[ "$(container single)" != "$first" ] || die "the single node's container was not replaced"
python3 "$CHECKS" ready "$SINGLE" 2>>"$LOG"
"$ENGINE" exec "$(container single)" test -s /data/goqueue.db
python3 "$CHECKS" has "$SINGLE" "$job_id" 2> >(tee -a "$LOG" >&2)
passed+=(sqlite)
