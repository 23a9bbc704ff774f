#!/usr/bin/env bash
# Make Docker usable for the rollmesh container stack on a machine that has none, and no registry.
#
#   eval "$(deploy/local-docker.sh)"      # as root; prints `export DOCKER_HOST=... BASE_IMAGE=...`
#   cd deploy && $ROLLMESH_COMPOSE up -d --build
#
# Contract (every step is skipped when what it makes is already there, so a second run takes seconds):
#   1. A daemon already reachable (DOCKER_HOST or the default socket) is used as it is: nothing is
#      installed or started, and BASE_IMAGE stays the Dockerfile's default (the official Python image)
#      unless ROLLMESH_LOCAL_BASE=1 asks for the local one (a daemon that reaches no registry).
#   2. Otherwise: docker.io, Docker Compose v2 and debootstrap are installed from Debian's packages when
#      missing (Compose v2 is the `docker compose` CLI plugin of Debian trixie's docker-compose package,
#      unpacked once into $ROOT/compose-v2 and linked as /usr/local/lib/docker/cli-plugins/docker-compose:
#      bookworm packages only Compose v1, which Harbor's `harbor run` and testcontainers cannot use);
#      a private dockerd is started (no iptables, no default bridge; user-defined networks
#      work) with its layers under $ROLLMESH_DOCKER_ROOT (default /var/lib/rollmesh-docker), so they are
#      cached between runs; overlay2 when the kernel mounts overlay, vfs otherwise.
#   3. The base image rollmesh-base:bookworm (Python 3.11) is made once with debootstrap from the
#      Debian mirror apt already uses, then imported (`docker import`); no registry is needed. So is
#      rollmesh-base:trixie (Python 3.13), the base of the `nemo-gym` service's image (NeMo Gym needs
#      Python >= 3.12, which bookworm does not have): exported as NEMO_GYM_BASE_IMAGE.
#   4. pip's find-links wheels (the CPU torch build lies there on such machines) are copied into
#      deploy/wheels/ (ROLLMESH_WHEELS_DIR), which the image build installs from; the CA bundle the
#      host's pip trusts (PIP_CERT, pip's `cert`, SSL_CERT_FILE: a TLS-inspecting proxy's CA lives
#      there) into deploy/certs/ (ROLLMESH_CERTS_DIR), which the image build adds to its trust store.
# stdout carries only `export` lines (for eval); progress goes to stderr. Every wait is bounded.
# Exit status: 0 ready, 1 a step failed (the line before says which), 2 not root when something must
# be installed or started.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${ROLLMESH_DOCKER_ROOT:-/var/lib/rollmesh-docker}"
RUN_DIR="${ROLLMESH_DOCKER_RUN:-/run/rollmesh-docker}"
SOCKET="$RUN_DIR/docker.sock"
BASE_TAG="${ROLLMESH_BASE_TAG:-rollmesh-base:bookworm}"
SUITE="${ROLLMESH_BASE_SUITE:-bookworm}"
NEMO_GYM_BASE_TAG="${ROLLMESH_NEMO_GYM_BASE_TAG:-rollmesh-base:trixie}"
NEMO_GYM_SUITE="${ROLLMESH_NEMO_GYM_BASE_SUITE:-trixie}"
DAEMON_WAIT_S="${ROLLMESH_DOCKERD_WAIT_S:-90}"

log() { printf 'local-docker: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "must run as root to $1"
    exit 2
  fi
}

daemon_answers() { timeout 20 docker info >/dev/null 2>&1; }

apt_updated=0
apt_install() {
  need_root "install $*"
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    timeout 600 apt-get update -q >&2 || die "apt-get update failed"
    apt_updated=1
  fi
  log "apt-get install $*"
  # policy-rc.d 101: the packages must not try to start their own daemon (there may be no init).
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && created_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -q --no-install-recommends "$@" >&2 \
    || { [ "$created_policy" = 1 ] && rm -f "$policy"; die "apt-get install $* failed"; }
  [ "$created_policy" = 1 ] && rm -f "$policy"
  return 0
}

compose_command() {
  if docker compose version >/dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose >/dev/null 2>&1; then
    echo "docker-compose"
  fi
}

# Compose v2 from Debian trixie's docker-compose package (a static Go binary; runs on bookworm), cached.
install_compose_v2() {
  local plugin_dir="${ROLLMESH_DOCKER_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}" cache="$ROOT/compose-v2" mirror filename
  if [ ! -x "$cache/docker-compose" ]; then
    need_root "install Docker Compose v2"
    mirror="$(debian_mirror)"
    mkdir -p "$cache"
    log "Docker Compose v2: trixie's docker-compose package from $mirror"
    curl -fsS -m 300 -o "$cache/Packages.xz" "$mirror/dists/trixie/main/binary-$(dpkg --print-architecture)/Packages.xz" \
      || die "could not read trixie's package index from $mirror"
    filename="$(xz -dc "$cache/Packages.xz" | awk '/^Package: docker-compose$/ {p = 1} p && /^Filename:/ {f = $2; p = 0} END {print f}')"
    rm -f "$cache/Packages.xz"
    [ -n "$filename" ] || die "trixie's package index names no docker-compose package"
    curl -fsS -m 600 -o "$cache/compose.deb" "$mirror/$filename" || die "could not fetch $mirror/$filename"
    dpkg-deb --fsys-tarfile "$cache/compose.deb" \
      | tar -x -O ./usr/libexec/docker/cli-plugins/docker-compose >"$cache/docker-compose.part" \
      || die "no docker-compose plugin in $filename"
    chmod 0755 "$cache/docker-compose.part" && mv "$cache/docker-compose.part" "$cache/docker-compose"
    rm -f "$cache/compose.deb"
  fi
  need_root "link the Docker Compose v2 plugin into $plugin_dir"
  mkdir -p "$plugin_dir" && ln -sf "$cache/docker-compose" "$plugin_dir/docker-compose"
  docker compose version >/dev/null 2>&1 || die "docker compose does not run after installing $cache/docker-compose"
}

# Compose v2 when it is missing. Not root, with Compose v1 there: v1 is used, and the log says what
# v2 would add (Harbor's `harbor run` and testcontainers' DockerCompose need it).
ensure_compose_v2() {
  docker compose version >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ] && command -v docker-compose >/dev/null 2>&1; then
    log "only Compose v1 (docker-compose) here: run as root once to add Compose v2 (Harbor and testcontainers need it)"
    return 0
  fi
  install_compose_v2
}

# The Debian mirror apt uses (deb822 sources first, then the one-line format).
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  if [ -z "$uri" ]; then
    uri="$(awk '$1 == "deb" && $0 ~ /debian\/? / {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
      /etc/apt/sources.list 2>/dev/null || true)"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

overlay_works() {
  local probe
  probe="$(mktemp -d "$ROOT/overlay-probe.XXXXXX")"
  mkdir -p "$probe/l" "$probe/u" "$probe/w" "$probe/m"
  local ok=1
  if mount -t overlay overlay -o "lowerdir=$probe/l,upperdir=$probe/u,workdir=$probe/w" "$probe/m" 2>/dev/null; then
    umount "$probe/m" && ok=0
  fi
  rm -rf "$probe"
  return "$ok"
}

start_private_daemon() {
  need_root "start dockerd"
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  mkdir -p "$ROOT" "$RUN_DIR"
  local driver="${ROLLMESH_DOCKER_STORAGE_DRIVER:-}"
  if [ -z "$driver" ]; then
    if overlay_works; then driver=overlay2; else driver=vfs; fi
  fi
  log "starting dockerd (storage $driver, data $ROOT/data, socket $SOCKET, log $ROOT/dockerd.log)"
  # setsid + nohup: the daemon outlives this script and the shell that ran it. It keeps none of the
  # caller's descriptors 3-9: under `flock FILE make test-containers` it would hold the lock forever.
  setsid nohup dockerd \
    --iptables=false --ip-masq=false --bridge=none \
    --storage-driver="$driver" \
    --data-root "$ROOT/data" --exec-root "$RUN_DIR/exec" \
    --pidfile "$RUN_DIR/dockerd.pid" \
    -H "unix://$SOCKET" >>"$ROOT/dockerd.log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  local deadline=$((SECONDS + DAEMON_WAIT_S))
  until daemon_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$ROOT/dockerd.log" >&2 || true
      die "dockerd did not answer within ${DAEMON_WAIT_S}s (see $ROOT/dockerd.log)"
    fi
    sleep 1
  done
  log "dockerd is up"
}

# make_base_image TAG SUITE: a Debian SUITE with its python3 (+ venv, pip), imported as TAG, once.
make_base_image() {
  local tag="$1" suite="$2"
  if timeout 30 docker image inspect "$tag" >/dev/null 2>&1; then
    log "base image $tag is cached"
    return
  fi
  command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
  local mirror rootfs
  mirror="$(debian_mirror)"
  rootfs="$(mktemp -d "$ROOT/rootfs.XXXXXX")"
  log "debootstrap $suite from $mirror into $rootfs"
  timeout 1200 debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    "$suite" "$rootfs" "$mirror" >"$ROOT/debootstrap-$suite.log" 2>&1 \
    || { tail -n 20 "$ROOT/debootstrap-$suite.log" >&2; rm -rf "$rootfs"; die "debootstrap $suite failed"; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  log "importing $rootfs as $tag"
  tar -C "$rootfs" -c . | timeout 600 docker import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >/dev/null \
    || { rm -rf "$rootfs"; die "docker import failed"; }
  rm -rf "$rootfs"
}

# pip's find-links folders (pip config + PIP_FIND_LINKS), whose wheels the build context must carry.
copy_find_links_wheels() {
  local dest="${ROLLMESH_WHEELS_DIR:-$HERE/wheels}" links dir copied=0
  mkdir -p "$dest"
  links="$( { python3 -m pip config list 2>/dev/null || true; } \
    | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p")"
  for dir in $links ${PIP_FIND_LINKS:-}; do
    dir="${dir#file://}"
    [ -d "$dir" ] || continue
    for whl in "$dir"/*.whl; do
      [ -e "$whl" ] || continue
      if [ ! -e "$dest/$(basename "$whl")" ]; then
        cp "$whl" "$dest/" && copied=$((copied + 1))
      fi
    done
  done
  log "deploy/wheels: $copied wheel(s) copied from pip's find-links, $(find "$dest" -name '*.whl' | wc -l) in total"
}

# The CA bundle the host's pip trusts, so that pip in the build trusts the same proxies.
copy_pip_ca_bundle() {
  local dest="${ROLLMESH_CERTS_DIR:-$HERE/certs}" bundle
  mkdir -p "$dest"
  bundle="${PIP_CERT:-}"
  if [ -z "$bundle" ]; then
    bundle="$( { python3 -m pip config list 2>/dev/null || true; } | sed -n "s/^[^=]*\.cert='\(.*\)'$/\1/p" | head -n 1)"
  fi
  bundle="${bundle:-${SSL_CERT_FILE:-}}"
  if [ -n "$bundle" ] && [ -f "$bundle" ]; then
    cp "$bundle" "$dest/host-ca-bundle.crt"
    log "deploy/certs: the CA bundle $bundle is added to the build's trust store"
  else
    rm -f "$dest/host-ca-bundle.crt"
  fi
}

main() {
  local use_local_base="${ROLLMESH_LOCAL_BASE:-}"
  command -v docker >/dev/null 2>&1 || apt_install docker.io
  if [ "${DOCKER_HOST:-}" = "unix://$SOCKET" ] && daemon_answers; then
    log "the private dockerd at $SOCKET is running"
    use_local_base="${use_local_base:-1}"
  elif daemon_answers; then
    log "a Docker daemon is reachable (${DOCKER_HOST:-default socket}); using it as it is"
  else
    export DOCKER_HOST="unix://$SOCKET"
    if daemon_answers; then
      log "the private dockerd at $SOCKET is running"
    else
      start_private_daemon
    fi
    use_local_base="${use_local_base:-1}"
  fi
  ensure_compose_v2
  local compose
  compose="$(compose_command)"
  [ -n "$compose" ] || die "no docker compose after installing Compose v2"
  copy_find_links_wheels
  copy_pip_ca_bundle
  if [ "$use_local_base" = 1 ]; then
    make_base_image "$BASE_TAG" "$SUITE"
    make_base_image "$NEMO_GYM_BASE_TAG" "$NEMO_GYM_SUITE"
    echo "export BASE_IMAGE=$BASE_TAG"
    echo "export NEMO_GYM_BASE_IMAGE=$NEMO_GYM_BASE_TAG"
  fi
  [ -n "${DOCKER_HOST:-}" ] && echo "export DOCKER_HOST=$DOCKER_HOST"
  echo "export ROLLMESH_COMPOSE='$compose'"
  log "ready: $(docker version --format '{{.Server.Version}}' 2>/dev/null) via ${DOCKER_HOST:-default socket}; compose: $compose"
}

main "$@"
