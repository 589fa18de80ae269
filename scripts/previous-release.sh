#!/usr/bin/env bash
# Builds the agent and the controller of the release before this tree's version, from the
# commit packaging/releases.tsv records for it (tags may not travel with the branch), and
# prints the directory holding both binaries: .tools/releases/<version>/bin (git-ignored,
# kept: built once per release). The mixed-version tests (tests/tests/lab_upgrade.rs) run it
# against this tree's binaries; scripts/test.sh exports the directory as
# METALGUARD_PREVIOUS_BIN_DIR.
#
# The release's source is `git archive`d into .tools/releases/<version>/src and built with
# this tree's target directory: the dependencies it shares with this tree are not built
# twice. Cargo puts the release's binaries where this tree's go (target/debug/); they are
# moved out at once, and the next build of this tree links its own back (cargo relinks
# binaries on every build, fresh or not).
#
#   scripts/previous-release.sh            # build (or reuse) and print the bin directory
#   scripts/previous-release.sh --version  # print only the previous release's version
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
say() { printf '[previous-release] %s\n' "$*" >&2; }

ours=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
# The last recorded release other than this tree's own version.
read -r version commit < <(awk -F '\t' -v ours="$ours" \
  '!/^#/ && NF >= 2 && $1 != ours { v = $1; c = $2 } END { if (v != "") print v, c }' \
  packaging/releases.tsv) || true
if [ -z "${version:-}" ]; then
  echo "previous-release.sh: packaging/releases.tsv records no release before $ours" >&2
  exit 1
fi
if [ "${1:-}" = "--version" ]; then
  echo "$version"
  exit 0
fi

dest="$root/.tools/releases/$version"
bin="$dest/bin"
if [ -x "$bin/metalguard-agent" ] && [ -x "$bin/metalguard-controller" ] \
  && [ "$(cat "$dest/commit" 2>/dev/null)" = "$commit" ]; then
  say "$version ($commit) present in $bin"
  echo "$bin"
  exit 0
fi

if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  say "commit $commit of $version is not in this clone; fetching it"
  git fetch --quiet origin "$commit" || {
    echo "previous-release.sh: commit $commit (release $version) is not in this clone and could not be fetched; a shallow clone needs 'git fetch --unshallow'" >&2
    exit 1
  }
fi

say "building $version from $commit (agent and controller)"
rm -rf "$dest"
mkdir -p "$dest/src" "$bin"
git archive "$commit" | tar -x -C "$dest/src"
target="$root/target"
# The agent and the controller, what the lab runs, with the features the release's whole
# workspace resolves (`--workspace --bin ...`): the same as this tree's test build for every
# dependency both use, so those are built once (a `-p` build per package resolved other
# features and built most dependencies again, issue 29). The controller so built carries its
# Kubernetes backend, which the lab's standalone configuration never starts.
(cd "$dest/src" && CARGO_TARGET_DIR="$target" cargo build --locked --quiet \
  --workspace --bin metalguard-agent --bin metalguard-controller)
mv "$target/debug/metalguard-agent" "$bin/metalguard-agent"
mv "$target/debug/metalguard-controller" "$bin/metalguard-controller"
rm -rf "$dest/src"
echo "$commit" > "$dest/commit"
say "$version: $("$bin/metalguard-agent" --version 2>/dev/null || echo agent), $("$bin/metalguard-controller" --version 2>/dev/null || echo controller)"
echo "$bin"
