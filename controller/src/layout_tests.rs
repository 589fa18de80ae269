//! Repository hygiene of `controller/src` (README "Layout"): no source file over
//! [`MAX_LINES`] lines (test-only files excepted), no import cycle between the top-level
//! modules (as `scripts/module_cycles.py` reports them), and the README's layout table naming
//! exactly the directories that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Split a file before it grows past this (STYLE.md, size and names).
const MAX_LINES: usize = 600;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Test-only files: `tests.rs`, `*_tests.rs`, `testkit.rs`.
fn is_test_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs") || name == "testkit.rs"
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|p| !is_test_file(p))
        .filter_map(|p| {
            let lines = std::fs::read_to_string(p).unwrap().lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split along their seams: {long:?}");
}

/// The top-level modules that `text` names as `crate::x`, comments and a trailing unit test
/// module left out.
fn referenced_modules(text: &str) -> BTreeSet<String> {
    let code = text
        .split("\n#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or_default();
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (i, _) in line.match_indices("crate::") {
            let name: String = line[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

/// Each top-level module (a file beside `main.rs` or a directory) and the others it imports.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            rust_files(&path, files.entry(stem).or_default());
        } else if stem != "main" && path.extension().is_some_and(|e| e == "rs") {
            files.entry(stem).or_default().push(path);
        }
    }
    let names: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, paths)| {
            let mut uses = BTreeSet::new();
            for path in paths.iter().filter(|p| !is_test_file(p)) {
                uses.extend(referenced_modules(&std::fs::read_to_string(path).unwrap()));
            }
            uses.retain(|m| m != module && names.contains(m));
            (module.clone(), uses)
        })
        .collect()
}

/// Whether `to` reaches `from` again through `graph`.
fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![to.to_owned()];
    while let Some(module) = stack.pop() {
        if module == from {
            return true;
        }
        if seen.insert(module.clone()) {
            stack.extend(graph.get(&module).into_iter().flatten().cloned());
        }
    }
    false
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    assert!(graph.contains_key("cli") && graph["cli"].contains("control"));
    let cycles: Vec<String> = graph
        .iter()
        .flat_map(|(from, uses)| {
            uses.iter()
                .filter(|to| reaches(&graph, from, to))
                .map(move |to| format!("{from} -> {to} -> … -> {from}"))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:?}");
}

#[test]
fn the_readme_layout_table_matches_controller_src() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let listed: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `controller/src/"))
        .filter_map(|l| l.split('`').next())
        .map(|p| p.trim_end_matches('/').to_owned())
        .collect();
    let dirs: BTreeSet<String> = std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed, dirs,
        "README layout rows `controller/src/...` against the directories"
    );
}

#[test]
fn referenced_modules_reads_paths_and_skips_comments() {
    let text = "use crate::api::hub::Hub;\n// crate::kube\nfn f() { crate::error::chain(e) }\n\
                #[cfg(test)]\nmod tests {\n    use crate::cli;\n}\n";
    let found: Vec<String> = referenced_modules(text).into_iter().collect();
    assert_eq!(found, ["api", "error"]);
}
