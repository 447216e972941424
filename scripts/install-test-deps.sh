#!/usr/bin/env bash
# Installs what actorcile's tests against a real control plane need, on Debian 12 (bookworm) as root:
#   * etcd (Debian package etcd-server) on PATH,
#   * kube-apiserver v1.20.2 built from Debian's `kubernetes` source package, cached at
#     ~/.cache/actorcile/bin/kube-apiserver (override the cache root with ACTORCILE_CACHE_DIR),
#   * podman + runc + busybox-static, with a containers.conf / storage.conf that work on these machines
#     written to ~/.cache/actorcile/podman/ (the service is not started).
# Idempotent: steps whose result is already present are skipped; a cached kube-apiserver that runs
# (`kube-apiserver --version`) is reused, a missing or corrupt one is rebuilt.
set -Eeuo pipefail

CACHE_DIR="${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}"
BIN_DIR="$CACHE_DIR/bin"
BUILD_DIR="$CACHE_DIR/build"
PODMAN_DIR="$CACHE_DIR/podman"
APISERVER="$BIN_DIR/kube-apiserver"
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
DEB_SRC_LIST=/etc/apt/sources.list.d/actorcile-deb-src.sources

APT_PACKAGES=(etcd-server golang-go rsync jq golang-github-modern-go-reflect2-dev podman runc busybox-static)

CURRENT_STEP="start"
step() {
    CURRENT_STEP="$*"
    echo "==> $*"
}
on_error() {
    local rc=$?
    echo "!!! install-test-deps.sh: step failed: ${CURRENT_STEP} (exit code ${rc})" >&2
    exit "$rc"
}
trap on_error ERR

export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "!!! must run as root (or have sudo) to install Debian packages" >&2
        exit 1
    fi
fi

APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        $SUDO apt-get update -q
        APT_UPDATED=1
    fi
}

# ---------------------------------------------------------------------------------------------------------
step "checking Debian packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != *"install ok installed"* ]]; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    step "installing Debian packages: ${missing[*]}"
    apt_update_once
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "    all present: ${APT_PACKAGES[*]}"
fi

step "checking etcd"
command -v etcd >/dev/null 2>&1
etcd --version | awk 'NR == 1'

# ---------------------------------------------------------------------------------------------------------
step "writing podman configuration to $PODMAN_DIR"
mkdir -p "$PODMAN_DIR"
cat >"$PODMAN_DIR/containers.conf" <<CONF
# Written by actorcile scripts/install-test-deps.sh. Use with CONTAINERS_CONF=$PODMAN_DIR/containers.conf
# crun fails here (cgroups in hybrid mode), and root lacks CAP_SYS_RESOURCE, so lower the default ulimits.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat >"$PODMAN_DIR/storage.conf" <<CONF
# Written by actorcile scripts/install-test-deps.sh. Use with CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf
[storage]
driver = "vfs"
graphroot = "$PODMAN_DIR/storage/graph"
runroot = "$PODMAN_DIR/storage/run"
CONF

# ---------------------------------------------------------------------------------------------------------
apiserver_works() {
    [ -x "$APISERVER" ] && "$APISERVER" --version >/dev/null 2>&1
}

step "checking cached kube-apiserver at $APISERVER"
if apiserver_works; then
    echo "    reusing $("$APISERVER" --version)"
else
    if [ -e "$APISERVER" ]; then
        echo "    cached binary is corrupt or does not run; rebuilding"
        rm -f "$APISERVER"
    else
        echo "    not present; building from Debian's kubernetes source package"
    fi

    step "enabling Debian source packages (deb-src bookworm main)"
    if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
        mirror="http://deb.debian.org/debian"
        keyring="/usr/share/keyrings/debian-archive-keyring.gpg"
        if [ -f /etc/apt/sources.list.d/debian.sources ]; then
            # First stanza of debian.sources is the main archive; reuse its mirror and keyring.
            m="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
            k="$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
            [ -n "$m" ] && mirror="$m"
            [ -n "$k" ] && keyring="$k"
        fi
        $SUDO tee "$DEB_SRC_LIST" >/dev/null <<SRC
Types: deb-src
URIs: $mirror
Suites: bookworm
Components: main
Signed-By: $keyring
SRC
        APT_UPDATED=0
    else
        echo "    a deb-src source is already configured"
    fi

    mkdir -p "$BUILD_DIR" "$BIN_DIR"
    cd "$BUILD_DIR"
    step "downloading the kubernetes source package"
    if ! ls "$BUILD_DIR"/kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
        apt_update_once
        apt-get source --download-only kubernetes
    else
        echo "    already downloaded: $(ls "$BUILD_DIR"/kubernetes_*.orig.tar.gz)"
    fi

    step "unpacking the kubernetes source"
    SRC_DIR="$BUILD_DIR/kubernetes-src"
    if [ ! -f "$SRC_DIR/.actorcile-unpacked" ]; then
        rm -rf "$SRC_DIR"
        mkdir -p "$SRC_DIR"
        tarball="$(ls "$BUILD_DIR"/kubernetes_*.orig.tar.gz | awk 'NR == 1')"
        tar -xzf "$tarball" -C "$SRC_DIR"
        # The tarball has one top-level directory; build inside it.
        top="$(find "$SRC_DIR" -mindepth 1 -maxdepth 1 -type d | awk 'NR == 1')"
        if [ -f "$SRC_DIR/Makefile" ]; then top="$SRC_DIR"; fi
        [ -f "$top/Makefile" ] || { echo "no Makefile found in the kubernetes source" >&2; false; }
        # Record the tree relative to SRC_DIR, so the cache directory can move.
        realpath --relative-to="$SRC_DIR" "$top" >"$SRC_DIR/.actorcile-unpacked"
    else
        echo "    already unpacked"
    fi
    KUBE_TREE="$(cat "$SRC_DIR/.actorcile-unpacked")"
    case "$KUBE_TREE" in /*) ;; *) KUBE_TREE="$SRC_DIR/$KUBE_TREE" ;; esac
    [ -f "$KUBE_TREE/Makefile" ] || { echo "unpacked tree $KUBE_TREE is incomplete; delete $SRC_DIR and rerun" >&2; false; }

    step "replacing vendored github.com/modern-go/reflect2 with Debian's 1.0.2 (Go >= 1.18 fix)"
    [ -d "$REFLECT2_SRC" ]
    rm -rf "$KUBE_TREE/vendor/github.com/modern-go/reflect2"
    mkdir -p "$KUBE_TREE/vendor/github.com/modern-go/reflect2"
    cp -rL "$REFLECT2_SRC"/. "$KUBE_TREE/vendor/github.com/modern-go/reflect2/"
    find "$KUBE_TREE/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete

    step "building kube-apiserver (make WHAT=cmd/kube-apiserver; takes about 4 minutes on 2 cores)"
    GO_HOME="$BUILD_DIR/gohome"
    mkdir -p "$GO_HOME"
    (cd "$KUBE_TREE" && HOME="$GO_HOME" CGO_ENABLED=0 make WHAT=cmd/kube-apiserver)

    step "installing kube-apiserver to $APISERVER"
    built="$KUBE_TREE/_output/bin/kube-apiserver"
    [ -x "$built" ] || built="$(find "$KUBE_TREE/_output" -type f -name kube-apiserver -perm -u+x | awk 'NR == 1')"
    [ -n "$built" ] && [ -x "$built" ]
    cp "$built" "$APISERVER.tmp"
    chmod 0755 "$APISERVER.tmp"
    mv "$APISERVER.tmp" "$APISERVER"
    apiserver_works
    echo "    built $("$APISERVER" --version)"
fi

step "done"
echo "    etcd:           $(command -v etcd)"
echo "    kube-apiserver: $APISERVER"
echo "    podman:         $(command -v podman) (CONTAINERS_CONF=$PODMAN_DIR/containers.conf CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf)"
