#!/usr/bin/env bash
# Builds the real Kubernetes and etcd 3.6 binaries the tests run, from Go modules, once:
# kube-apiserver, kube-controller-manager and kubectl of the release pinned in tests/kube/k8s/go.mod,
# and etcd + etcdctl of the release pinned in tests/kube/etcd/go.mod, into
# .tools/kube/<k8s version>/ and .tools/etcd/<etcd version>/ (git-ignored, keyed by version).
# Safe to run again: a binary that is present and answers with its version is not rebuilt.
#
# Prints nothing but progress on stderr; `scripts/kube-build.sh --print-env` prints the
# variables the harness reads (METALGUARD_KUBE_BIN_DIR, METALGUARD_ETCD36_BIN).
# `scripts/kube-build.sh --node` also builds what runs Pods on a node: kubelet, kube-scheduler
# and kube-proxy of the same release, and the sandbox program of the node's Pods
# (tests/kube/k8s/pause), for the tests that run the shipped Deployment as Pods (issue 26).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
say() { printf '[kube-build] %s\n' "$*" >&2; }

k8s_version="$(awk '/^require k8s.io\/kubernetes /{print $3}' "$root/tests/kube/k8s/go.mod")"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$root/tests/kube/etcd/go.mod")"
kube_dir="$root/.tools/kube/$k8s_version"
etcd_dir="$root/.tools/etcd/$etcd_version"

commands=(kube-apiserver kube-controller-manager kubectl)
if [[ "${1:-}" == "--node" ]]; then
    commands+=(kubelet kube-scheduler kube-proxy)
fi

if [[ "${1:-}" == "--print-env" ]]; then
    echo "METALGUARD_KUBE_BIN_DIR=$kube_dir"
    echo "METALGUARD_ETCD36_BIN=$etcd_dir/etcd"
    exit 0
fi

export CGO_ENABLED=0 GOFLAGS=-mod=mod
# The Go build cache and module cache stay where Go keeps them (~/.cache/go-build, ~/go/pkg),
# so a second checkout on the same machine reuses them.
tags="selinux,notest,grpcnotrace"

build_kube() {
    local major minor
    major="${k8s_version#v}"; major="${major%%.*}"
    minor="${k8s_version#v*.}"; minor="${minor%%.*}"
    local pkg=k8s.io/client-go/pkg/version base=k8s.io/component-base/version
    local ldflags="-s -w"
    for p in "$pkg" "$base"; do
        ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=$major -X $p.gitMinor=$minor"
        ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    mkdir -p "$kube_dir"
    for cmd in "${commands[@]}"; do
        local version_of=("$kube_dir/$cmd" --version)
        [[ "$cmd" == kubectl ]] && version_of=("$kube_dir/$cmd" version --client)
        # Read whole, then matched: `… | grep -q` under pipefail fails when grep exits first.
        if [[ -x "$kube_dir/$cmd" ]] && grep -q "$k8s_version" <<<"$("${version_of[@]}" 2>/dev/null)"; then
            say "$cmd $k8s_version present"
            continue
        fi
        say "building $cmd $k8s_version (first time: several minutes, ~2 GiB of memory)"
        (cd "$root/tests/kube/k8s" && go build -trimpath -tags "$tags" -ldflags "$ldflags" \
            -o "$kube_dir/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
        mv "$kube_dir/$cmd.tmp" "$kube_dir/$cmd"
    done
}

build_etcd() {
    mkdir -p "$etcd_dir"
    if [[ -x "$etcd_dir/etcd" ]] && grep -q "${etcd_version#v}" <<<"$("$etcd_dir/etcd" --version 2>/dev/null)"; then
        say "etcd $etcd_version present"
    else
        say "building etcd $etcd_version"
        (cd "$root/tests/kube/etcd" && go build -trimpath -ldflags "-s -w" \
            -o "$etcd_dir/etcd.tmp" go.etcd.io/etcd/server/v3)
        mv "$etcd_dir/etcd.tmp" "$etcd_dir/etcd"
    fi
    if [[ ! -x "$etcd_dir/etcdctl" ]]; then
        say "building etcdctl $etcd_version"
        (cd "$root/tests/kube/etcd" && go build -trimpath -ldflags "-s -w" \
            -o "$etcd_dir/etcdctl.tmp" go.etcd.io/etcd/etcdctl/v3)
        mv "$etcd_dir/etcdctl.tmp" "$etcd_dir/etcdctl"
    fi
}

build_pause() {
    if [[ -x "$kube_dir/pause" ]]; then
        say "pause present"
        return
    fi
    say "building pause"
    (cd "$root/tests/kube/k8s" && go build -trimpath -ldflags "-s -w" -o "$kube_dir/pause.tmp" ./pause)
    mv "$kube_dir/pause.tmp" "$kube_dir/pause"
}

build_etcd
build_kube
if [[ "${1:-}" == "--node" ]]; then
    build_pause
fi
say "done: $kube_dir, $etcd_dir"
