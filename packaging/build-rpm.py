#!/usr/bin/env python3
"""Builds a package's .rpm with rpmbuild (Debian's `rpm` package) from its Cargo manifest.

    packaging/build-rpm.py PACKAGE [--fast]

PACKAGE is a workspace package (metalguard-agent, metalguard-controller). Its
`[package.metadata.rpm]` table names the rpm, its summary, the scriptlet files and the assets
(source relative to the package's directory, destination, mode, and `config = "noreplace"` or
`doc = true`); name, version, license, repository and description come from `cargo metadata`.
The spec is written to target/rpm/build/PACKAGE.spec and the package to
target/rpm/NAME-VERSION-1.x86_64.rpm. Assets are packed as they are: no stripping, no
debuginfo subpackage, no build-root policy scripts (build-packages.sh has already stripped
what a release ships). `--fast` compresses at zstd level 1 (the package test's builds).

This replaced cargo-generate-rpm (issue 29): building that tool from crates.io took 3.9 of the
cold test command's minutes, and rpmbuild is already installed for the package test's
`rpm -qp` checks.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fail(message: str) -> None:
    print(f"build-rpm.py: {message}", file=sys.stderr)
    sys.exit(1)


def package_metadata(name: str) -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--locked", "--format-version", "1"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    for package in json.loads(out)["packages"]:
        if package["name"] == name:
            return package
    fail(f"no workspace package named {name}")
    raise AssertionError


def spec_text(package: dict, rpm: dict, package_dir: Path) -> str:
    name = rpm.get("name", package["name"])
    lines = [
        f"Name: {name}",
        f"Version: {package['version']}",
        "Release: 1",
        f"Summary: {rpm.get('summary', package['description'])}",
        f"License: {package['license']}",
        f"URL: {package['repository']}",
    ]
    lines += [f"Requires: {req}" for req in rpm.get("requires", [])]
    lines += [
        "",
        "%description",
        package["description"],
        "",
        "%install",
    ]
    files = []
    for asset in rpm["assets"]:
        source = (package_dir / asset["source"]).resolve()
        if not source.is_file():
            fail(f"asset {source} is missing (build the binaries and the generated assets first)")
        dest = asset["dest"]
        if not dest.startswith("/") or any(c in dest for c in " \t\n%\"'"):
            fail(f"asset destination {dest!r} must be an absolute path without spaces or quotes")
        mode = asset["mode"]
        lines.append(f"install -D -m {mode} '{source}' '%{{buildroot}}{dest}'")
        entry = f"%attr({mode},root,root) {dest}"
        if asset.get("config") == "noreplace":
            entry = f"%config(noreplace) {entry}"
        elif asset.get("config"):
            entry = f"%config {entry}"
        if asset.get("doc"):
            entry = f"%doc {entry}"
        files.append(entry)
    lines += ["", "%files", *files]
    for section, key in (("%post", "post_install_script"), ("%preun", "pre_uninstall_script"),
                         ("%postun", "post_uninstall_script")):
        if key in rpm:
            script = (package_dir / rpm[key]).read_text()
            lines += ["", section, script.rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = sys.argv[1:]
    fast = "--fast" in args
    args = [a for a in args if a != "--fast"]
    if len(args) != 1:
        fail("usage: packaging/build-rpm.py PACKAGE [--fast]")
    if shutil.which("rpmbuild") is None:
        fail("rpmbuild not found: apt-get install rpm")
    package = package_metadata(args[0])
    rpm = package.get("metadata", {}).get("rpm")
    if not rpm:
        fail(f"{args[0]} has no [package.metadata.rpm] table")
    package_dir = Path(package["manifest_path"]).parent
    out = ROOT / "target" / "rpm"
    build = out / "build"
    top = build / args[0]
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir(parents=True)
    spec = build / f"{args[0]}.spec"
    spec.write_text(spec_text(package, rpm, package_dir))
    defines = {
        "_topdir": str(top),
        "_rpmdir": str(out),
        "_build_name_fmt": "%%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
        "_binary_payload": "w1.zstdio" if fast else "w19.zstdio",
        "debug_package": "%{nil}",
        "__os_install_post": "%{nil}",
        "__strip": "/bin/true",
        "_build_id_links": "none",
    }
    command = ["rpmbuild", "-bb", "--quiet", "--target", "x86_64"]
    for key, value in defines.items():
        command += ["--define", f"{key} {value}"]
    command.append(str(spec))
    env = dict(os.environ, LC_ALL="C")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        fail(f"rpmbuild failed for {args[0]} (spec: {spec})")
    shutil.rmtree(top, ignore_errors=True)
    built = out / f"{rpm.get('name', package['name'])}-{package['version']}-1.x86_64.rpm"
    if not built.is_file():
        fail(f"rpmbuild reported success but {built} is missing")
    print(built)


if __name__ == "__main__":
    main()
