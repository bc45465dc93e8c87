# Shared by build.sh and smoke.sh (sourced, not run): the container engine, the cache, and
# images made from Debian's packages for a machine where no registry serves images.
# shellcheck shell=bash disable=SC2034  # the variables are the sourcing scripts'

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/deploy/container"
CACHE="${GOQUEUE_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/goqueue-container}"
SUITE="${GOQUEUE_DEBIAN_SUITE:-bookworm}"
MIRROR="${GOQUEUE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${GOQUEUE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
IMAGE="localhost/goqueue:latest"
LOCAL_BASE="localhost/goqueue-base:$SUITE"
mkdir -p "$CACHE"

say() { printf '%s %s\n' "[$(date -u +%H:%M:%S)]" "$*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# Install Debian packages with apt (root only).
apt_install() {
    command -v apt-get >/dev/null || die "missing: $* (and no apt-get to install it)"
    [ "$(id -u)" -eq 0 ] || die "missing: $*; install it (apt-get needs root)"
    say "installing with apt: $*"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq "$@" || { apt-get update -qq && apt-get install -y -qq "$@"; }; } \
        >"$CACHE/apt.log" 2>&1 || { cat "$CACHE/apt.log" >&2 && die "apt could not install $*"; }
}

# The commands named, each installed from the Debian package of the same name if missing.
need() {
    local missing=() cmd
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    [ "${#missing[@]}" -eq 0 ] || apt_install "${missing[@]}"
}

# ENGINE: podman when present, else docker when its daemon answers, else podman from apt.
pick_engine() {
    if command -v podman >/dev/null; then
        ENGINE=podman
    elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        ENGINE=docker
    else
        need podman runc
        ENGINE=podman
    fi
}

# A throwaway container with no network and no healthcheck: run_once [OPTIONS] IMAGE [ARGS].
run_once() { "$ENGINE" run --rm --network none --no-healthcheck "$@"; }

# Podman's defaults fail on some hosts: crun refuses cgroups in hybrid mode, and the
# runtime's setrlimit for the default ulimits is refused. When a trial container fails,
# use a containers.conf of our own (runc, no default ulimits) for every podman call of
# this script, podman-compose's included; the machine's own configuration is not changed.
podman_config() {
    local probe_image="$1" conf="$CACHE/containers.conf" out
    [ "$ENGINE" = podman ] || return 0
    [ -n "${CONTAINERS_CONF:-}" ] && return 0
    out="$(run_once --entrypoint /bin/true "$probe_image" 2>&1)" && return 0
    need runc
    printf '%s\n' '[containers]' 'default_ulimits = []' '' '[engine]' 'runtime = "runc"' >"$conf"
    export CONTAINERS_CONF="$conf"
    run_once --entrypoint /bin/true "$probe_image" >/dev/null 2>&1 \
        || die "podman cannot run a container, with its defaults or with $conf: $out"
    say "podman's defaults cannot start a container here (${out%%$'\n'*});" \
        "using $conf (runc, no default ulimits)"
}

have_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
image_id() { "$ENGINE" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

# Pull an image unless it is already local; quiet, and false when no registry serves it.
pull() {
    have_image "$1" && return 0
    timeout 120 "$ENGINE" pull -q "$1" >/dev/null 2>&1
}

# A Debian root file system with the packages given (mmdebstrap's smallest variant,
# "essential": Essential packages plus these), imported as image $1. Further arguments
# are mmdebstrap options (hooks). The image in the engine's storage is the cache: it is
# built once, then reused until removed.
debian_rootfs() {
    local image="$1" packages="$2" tarball
    shift 2
    have_image "$image" && return 0
    need mmdebstrap
    tarball="$(mktemp "$CACHE/rootfs.XXXXXX.tar")"
    say "building $image from Debian $SUITE packages: $packages"
    mmdebstrap --quiet --variant=essential --include="$packages" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$@" "$SUITE" "$tarball" \
        "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main" </dev/null \
        || { rm -f "$tarball" && die "mmdebstrap failed for $image"; }
    "$ENGINE" import -q \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
    rm -f "$tarball"
}

# The base of the node image: the public one when it can be pulled, else Debian's Python.
pick_base() {
    BASE="${GOQUEUE_BASE:-python:3.11-slim}"
    if pull "$BASE"; then
        say "base image: $BASE"
        return 0
    fi
    say "cannot pull $BASE; using Debian's Python instead ($LOCAL_BASE)"
    BASE="$LOCAL_BASE"
    debian_rootfs "$BASE" python3,python3-venv,python-is-python3,ca-certificates,passwd
}

# A virtualenv of our own (this machine's python3) for podman-compose and pip's downloads.
tools_venv() {
    TOOLS="$CACHE/venv"
    [ -x "$TOOLS/bin/pip" ] && return 0
    python3 -m venv "$TOOLS" 2>/dev/null \
        || { apt_install python3-venv && python3 -m venv "$TOOLS"; }
}
