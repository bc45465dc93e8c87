#!/usr/bin/env bash
# Build the node image, localhost/goqueue:latest, from deploy/Dockerfile with podman or
# docker, whichever is here (podman is installed with apt when neither works).
#   bash deploy/container/build.sh
# When the public base (python:3.11-slim) cannot be pulled, the base is Debian's Python,
# built from Debian's packages with mmdebstrap and imported once (kept as
# localhost/goqueue-base:bookworm; remove that image to rebuild it). With podman the build
# itself has no network: the host's pip fetches the dependencies' wheels into a cache
# folder (~/.cache/goqueue-container/wheels) mounted into the build.
# Environment: GOQUEUE_BASE (another base image), GOQUEUE_CONTAINER_CACHE,
# GOQUEUE_DEBIAN_MIRROR, GOQUEUE_DEBIAN_SECURITY_MIRROR.
set -euo pipefail
# shellcheck source=deploy/container/lib.sh
. "$(dirname "$0")/lib.sh"

started=$SECONDS
pick_engine
pick_base
podman_config "$BASE"

# The runtime dependencies from pyproject.toml, as wheels for this machine's Python, which
# must be the base image's: offline from the cache first, then from the package index.
wheelhouse() {
    local want have reqs
    tools_venv
    local version='import sys; print(sys.version_info[:2])'
    want="$(run_once "$BASE" python3 -c "$version")"
    have="$("$TOOLS/bin/python" -c "$version")"
    if [ "$want" != "$have" ]; then
        say "this machine's Python $have is not the base image's $want: pip in the build uses PyPI"
        return 1
    fi
    WHEELS="$CACHE/wheels"
    reqs="$CACHE/requirements.txt"
    mkdir -p "$WHEELS"
    "$TOOLS/bin/python" - "$ROOT/pyproject.toml" >"$reqs" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
print("\n".join([*project["build-system"]["requires"], *project["project"]["dependencies"]]))
EOF
    "$TOOLS/bin/pip" wheel -q --no-index --find-links "$WHEELS" -w "$WHEELS" -r "$reqs" \
        >/dev/null 2>&1 && return 0
    "$TOOLS/bin/pip" wheel -q --find-links "$WHEELS" -w "$WHEELS" -r "$reqs" \
        >"$CACHE/pip.log" 2>&1 \
        || { cat "$CACHE/pip.log" >&2 && die "pip could not fetch the wheels (above)"; }
}

say "building $IMAGE with $ENGINE (base $BASE)"
# podman keeps the build stage as an image (the layer cache of the next build), untagged:
# it is tagged here, so the one a rebuild replaces can be removed like the old image.
STAGE="localhost/goqueue-build-stage:latest"
previous=("$(image_id "$IMAGE")" "$(image_id "$STAGE")")
if [ "$ENGINE" = podman ] && wheelhouse; then
    # --format docker keeps the Dockerfile's HEALTHCHECK (the OCI format has none).
    build=(podman build -q --format docker --network none --volume "$WHEELS:/wheels:ro"
        --build-arg BASE="$BASE" --build-arg WHEELS=/wheels -f "$ROOT/deploy/Dockerfile")
else
    build=("$ENGINE" build -q --network host --build-arg BASE="$BASE" -f "$ROOT/deploy/Dockerfile")
fi
[ "$ENGINE" = podman ] && "${build[@]}" --target build -t "$STAGE" "$ROOT" >/dev/null
"${build[@]}" -t "$IMAGE" "$ROOT" >/dev/null

# What this build replaced, left untagged: removed unless a container still uses it.
current=("$(image_id "$IMAGE")" "$(image_id "$STAGE")")
for old in "${previous[@]}"; do
    case " ${current[*]} " in
        *" $old "*) ;;
        *) [ -z "$old" ] || "$ENGINE" rmi "$old" >/dev/null 2>&1 || true ;;
    esac
done

version="$(run_once --entrypoint python "$IMAGE" -c \
    'import importlib.metadata as m; print("goqueue", m.version("goqueue"))' 2>&1)" \
    || die "the image does not run: $version"
size="$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")"
say "built $IMAGE ($version, $((size / 1000000)) MB, base $BASE) in $((SECONDS - started)) s"
