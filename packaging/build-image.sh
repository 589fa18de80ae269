#!/usr/bin/env bash
# Builds the controller's container image without Docker or a registry (issue 26, item 1):
# the static (musl) release binary on an empty base, run as 65532:65532 with the entrypoint
# /metalguard-controller and ports 8443 and 9090, the layout packaging/kubernetes/Dockerfile
# describes. umoci writes the OCI image layout and skopeo turns it into a docker-archive,
# which `ctr -n k8s.io images import`, `docker load` and `podman load` all take. The image is
# tagged docker.io/library/metalguard-controller:VERSION, the name the shipped Deployment's
# `image: metalguard-controller:VERSION` resolves to, so no registry is needed.
#   packaging/build-image.sh [--out DIR] [--jobs N] [--profile dev]
# Writes DIR/metalguard-controller-VERSION.tar (default DIR: target/image) and prints its
# path and size. Needs umoci and skopeo (Debian packages; installed here when missing and
# root), musl-tools and the rust target x86_64-unknown-linux-musl (added when missing).
#   --profile dev packs the test build's controller instead (scripts/test.sh: the image test,
#   tests/tests/image.rs): the dynamic binary `cargo build --workspace` links, stripped, with
#   the shared libraries and the loader `ldd` names, at their paths. Same layout, user,
#   entrypoint and ports as the release image; not for shipping (a release build for musl is
#   ~10 minutes of both cores on a cold machine, which the test command does not spend).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[image] %s\n' "$*"; }

out=target/image
jobs=()
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift ;;
    --jobs) jobs=(--jobs "$2"); shift ;;
    --profile) profile="${2:?--profile needs release or dev}"; shift ;;
    *) echo "usage: packaging/build-image.sh [--out DIR] [--jobs N] [--profile dev]" >&2; exit 2 ;;
  esac
  shift
done

case "$profile" in release|dev) ;; *) echo "--profile: release or dev" >&2; exit 2 ;; esac
missing=()
needed=(umoci skopeo)
[ "$profile" = release ] && needed+=(musl-gcc)
for tool in "${needed[@]}"; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "missing: ${missing[*]} (apt install umoci skopeo musl-tools)" >&2; exit 2; }
  say "installing umoci, skopeo and musl-tools"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends umoci skopeo musl-tools >/dev/null
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
ref="docker.io/library/metalguard-controller:$version"
if [ "$profile" = release ]; then
  target=x86_64-unknown-linux-musl
  grep -qx "$target" <<<"$(rustup target list --installed)" || rustup target add "$target"
  say "building the static controller $version ($target, release)"
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked "${jobs[@]}" -p metalguard-controller --target "$target"
  bin="target/$target/release/metalguard-controller"
  # A static binary has no program interpreter: it runs on the empty base.
  # Read whole, then matched: `readelf | grep -q` under pipefail fails when grep exits first.
  if grep -q 'Requesting program interpreter' <<<"$(readelf -l "$bin")"; then
    echo "$bin is not static" >&2
    exit 1
  fi
else
  say "the test build's controller $version (dynamic, with its libraries)"
  cargo build --locked "${jobs[@]}" --workspace --bin metalguard-controller
  bin=target/debug/metalguard-controller
fi

mkdir -p "$out"
layout="$out/layout"
bundle="$out/bundle"
archive="$out/metalguard-controller-$version.tar"
rm -rf "$layout" "$bundle" "$archive"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci unpack --image "$layout:$version" "$bundle"
install -m 0755 "$bin" "$bundle/rootfs/metalguard-controller"
if [ "$profile" = dev ]; then
  strip -s "$bundle/rootfs/metalguard-controller"
  # Every library ldd resolves ("name => /path (addr)") and the loader ("/path (addr)"),
  # copied (symlinks followed) to the path the binary asks for; owned by root, read-only.
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u \
    | while read -r lib; do
        install -D -m 0644 "$(readlink -f "$lib")" "$bundle/rootfs$lib"
      done
  chmod 0755 "$bundle"/rootfs/lib64/ld-linux-*.so.* 2>/dev/null || true
fi
umoci repack --image "$layout:$version" "$bundle"
umoci config --image "$layout:$version" \
  --os linux --architecture amd64 \
  --config.entrypoint /metalguard-controller \
  --config.user 65532:65532 \
  --config.workingdir / \
  --config.exposedports 8443/tcp --config.exposedports 9090/tcp \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "io.metalguard.build-profile=$profile" \
  --config.label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
umoci gc --layout "$layout"
skopeo copy --quiet "oci:$layout:$version" "docker-archive:$archive:$ref"
rm -rf "$bundle"
say "$archive ($(du -h "$archive" | cut -f1), binary $(du -h "$bin" | cut -f1)) as $ref"
