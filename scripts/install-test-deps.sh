#!/usr/bin/env bash
# Installs what actorcile's tests against a real control plane need, on Debian 12 (bookworm) as root:
#   * kube-apiserver, kube-controller-manager and etcd built with the machine's Go (1.26 or newer)
#     from the Go modules pinned in tools/control-plane/ (go.mod: the newest Kubernetes release that
#     builds here; oldest.mod: the oldest Kubernetes release actorcile supports, kube-apiserver
#     only), into a versioned cache: ~/.cache/actorcile/k8s/<version>/bin/ (override the cache root
#     with ACTORCILE_CACHE_DIR). Each folder has controller-runtime's KUBEBUILDER_ASSETS layout
#     (kube-apiserver and etcd side by side);
#   * the controller-runtime side of `actorcile bench` (tools/bench-controller-runtime), built the
#     same way into ~/.cache/actorcile/bench/;
#   * Helm and promtool (tools/helm, tools/promtool: Go modules that pin them), for the example
#     operator's chart and alert rules, into ~/.cache/actorcile/tools/<name>/;
#   * libfaketime, with which the chaos suite sets the operator processes' wall clocks apart;
#   * podman + runc + busybox-static, with a containers.conf / storage.conf that work on these machines
#     written to ~/.cache/actorcile/podman/ (the service is not started).
# Idempotent: a cached build whose stamp matches the pinned modules and whose binaries run
# (`--version`) is reused; a missing, stale or corrupt one is rebuilt. Prints what it builds and how
# long each build took.
set -Eeuo pipefail

CACHE_DIR="${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}"
PODMAN_DIR="$CACHE_DIR/podman"
K8S_DIR="$CACHE_DIR/k8s"
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
CONTROL_PLANE_SRC="$REPO_DIR/tools/control-plane"

APT_PACKAGES=(podman runc busybox-static libfaketime)

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
# The machine's Go, never Debian's golang-go (Go 1.19, too old for these modules) should it be installed.
step "finding Go 1.26 or newer"
GO=""
for candidate in /usr/local/go/bin/go "$(command -v go || true)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    minor="$("$candidate" env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
    if [ "${minor:-0}" -ge 26 ] 2>/dev/null; then GO="$candidate"; break; fi
done
if [ -z "$GO" ]; then
    echo "!!! no Go 1.26 or newer found (tried /usr/local/go/bin/go and PATH)" >&2
    false
fi
echo "    $GO ($("$GO" env GOVERSION))"
# No toolchain download behind our back; go.sum is checked, never rewritten.
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0
# The builds' module and build caches in a folder of their own, removed when the script ends: what
# is kept are the binaries (their stamps decide when one is rebuilt), and the caches of these
# module graphs (several GB) would otherwise stay on the machine's disk beside the tests' builds.
GO_WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/actorcile-go.XXXXXX")"
export GOCACHE="$GO_WORK_DIR/build" GOMODCACHE="$GO_WORK_DIR/mod" GOFLAGS="$GOFLAGS -modcacherw"
trap 'rm -rf "$GO_WORK_DIR"' EXIT
# go_build ARGS...: `go build ARGS...`, then its build cache dropped: the builds below share little
# (other versions of the same modules), so the disk holds one build's cache at a time.
go_build() {
    "$GO" build "$@"
    rm -rf "$GOCACHE"
}

# The version of k8s.io/kubernetes (or etcd) a module file pins.
pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$CONTROL_PLANE_SRC/$1"; }

# all_run DIR COMMAND... : every command in DIR runs `--version`.
all_run() {
    local dir="$1"; shift
    for c in "$@"; do "$dir/$c" --version >/dev/null 2>&1 || return 1; done
}

# build_control_plane MODFILE COMMAND... : builds the commands with MODFILE into
# $K8S_DIR/<kubernetes version>/bin, unless a build from the same sources is there and runs.
build_control_plane() {
    local modfile="$1"; shift
    local version stamp dir want have started
    version="$(pinned "$modfile" k8s.io/kubernetes)"
    [ -n "$version" ] || { echo "!!! $modfile pins no k8s.io/kubernetes version" >&2; false; }
    dir="$K8S_DIR/$version/bin"
    want="$(cd "$CONTROL_PLANE_SRC" && cat "$modfile" "${modfile%.mod}.sum" */main.go | sha256sum | awk '{print $1}') $*"
    have="$(cat "$dir/.stamp" 2>/dev/null || true)"
    step "checking the cached Kubernetes $version build in $dir ($*)"
    if [ "$want" = "$have" ] && all_run "$dir" "$@"; then
        for c in "$@"; do echo "    reusing $c: $("$dir/$c" --version 2>&1 | awk 'NR == 1')"; done
        return 0
    fi
    step "building $* from k8s.io/kubernetes $version (tools/control-plane/$modfile; about 10 minutes on 2 cores when nothing is cached)"
    mkdir -p "$dir"
    rm -f "$dir/.stamp"
    local v=k8s.io/component-base/version minor="${version#v1.}"
    minor="${minor%%.*}"
    local ldflags="-s -w -X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
    started=$SECONDS
    local pkgs=()
    for c in "$@"; do pkgs+=("./$c"); done
    (cd "$CONTROL_PLANE_SRC" && go_build -modfile="$modfile" -ldflags="$ldflags" -o "$dir/" "${pkgs[@]}")
    for c in "$@"; do
        "$dir/$c" --version >/dev/null 2>&1
        echo "    built $c: $("$dir/$c" --version 2>&1 | awk 'NR == 1')"
    done
    echo "    took $((SECONDS - started)) s"
    echo "$want" >"$dir/.stamp"
}

# build_bench_controller_runtime: the controller-runtime side of `actorcile bench`
# (tools/bench-controller-runtime) into $CACHE_DIR/bench/, unless a build from the same sources is
# there.
build_bench_controller_runtime() {
    local src="$REPO_DIR/tools/bench-controller-runtime" dir="$CACHE_DIR/bench" want have started
    want="$(cd "$src" && cat go.mod go.sum ./*.go | sha256sum | awk '{print $1}')"
    have="$(cat "$dir/.stamp" 2>/dev/null || true)"
    step "checking the cached controller-runtime bench program in $dir"
    if [ "$want" = "$have" ] && [ -x "$dir/bench-controller-runtime" ]; then
        echo "    reusing bench-controller-runtime ($(awk '$1 == "sigs.k8s.io/controller-runtime" {print $2}' "$src/go.mod"))"
        return 0
    fi
    step "building the controller-runtime bench program (tools/bench-controller-runtime)"
    mkdir -p "$dir"
    rm -f "$dir/.stamp"
    started=$SECONDS
    (cd "$src" && go_build -ldflags="-s -w" -o "$dir/bench-controller-runtime" .)
    echo "    built bench-controller-runtime ($(awk '$1 == "sigs.k8s.io/controller-runtime" {print $2}' "$src/go.mod"))"
    echo "    took $((SECONDS - started)) s"
    echo "$want" >"$dir/.stamp"
}

# build_go_tool NAME PACKAGE MODULE [LDFLAGS]: the command PACKAGE of the Go module pinned in
# tools/NAME/ (go.mod's `tool` line; MODULE is the module whose version it reports) into
# $CACHE_DIR/tools/NAME/NAME, unless a build from the same go.mod and go.sum is there and runs.
build_go_tool() {
    local name="$1" pkg="$2" module="$3" ldflags="${4:-}" src="$REPO_DIR/tools/$1" dir="$CACHE_DIR/tools/$1"
    local want have started version
    version="$(awk -v m="$module" '$1 == m {print $2; exit}' "$src/go.mod")"
    want="$(cd "$src" && cat go.mod go.sum | sha256sum | awk '{print $1}')"
    have="$(cat "$dir/.stamp" 2>/dev/null || true)"
    step "checking the cached $name build in $dir"
    if [ "$want" = "$have" ] && "$dir/$name" --help >/dev/null 2>&1; then
        echo "    reusing $name ($module $version)"
        return 0
    fi
    step "building $name from $module $version (tools/$name)"
    mkdir -p "$dir"
    rm -f "$dir/.stamp"
    started=$SECONDS
    (cd "$src" && go_build -ldflags="-s -w ${ldflags//@VERSION@/$version}" -o "$dir/$name" "$pkg")
    "$dir/$name" --help >/dev/null 2>&1
    echo "    built $name ($module $version)"
    echo "    took $((SECONDS - started)) s"
    echo "$want" >"$dir/.stamp"
}

NEWEST="$(pinned go.mod k8s.io/kubernetes)"
OLDEST="$(pinned oldest.mod k8s.io/kubernetes)"
build_control_plane go.mod kube-apiserver kube-controller-manager etcd
build_control_plane oldest.mod kube-apiserver
build_bench_controller_runtime
# The deploy kit's tools: Helm (lint, template and install of the example operator's chart) and
# promtool (the alert rules' check and unit tests).
build_go_tool helm helm.sh/helm/v4/cmd/helm helm.sh/helm/v4 \
    "-X helm.sh/helm/v4/internal/version.version=@VERSION@"
build_go_tool promtool github.com/prometheus/prometheus/cmd/promtool github.com/prometheus/prometheus \
    "-X github.com/prometheus/common/version.Version=@VERSION@"
# The oldest apiserver runs on the newest etcd (the etcd v3 API is stable across these releases):
# KUBEBUILDER_ASSETS needs both in one folder.
ln -sf "$K8S_DIR/$NEWEST/bin/etcd" "$K8S_DIR/$OLDEST/bin/etcd"
# What envtest picks by default when no variable names a folder: see actorcile::envtest::binaries.
echo "$NEWEST" >"$K8S_DIR/newest"
echo "$OLDEST" >"$K8S_DIR/oldest"

step "done"
echo "    newest: KUBEBUILDER_ASSETS=$K8S_DIR/$NEWEST/bin (kube-apiserver, kube-controller-manager, etcd)"
echo "    oldest: KUBEBUILDER_ASSETS=$K8S_DIR/$OLDEST/bin (kube-apiserver, etcd)"
echo "    helm:     $CACHE_DIR/tools/helm/helm"
echo "    promtool: $CACHE_DIR/tools/promtool/promtool"
echo "    podman:         $(command -v podman) (CONTAINERS_CONF=$PODMAN_DIR/containers.conf CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf)"
