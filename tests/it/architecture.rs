//! The crate graph is the architecture: each workspace crate depends only on crates of a lower layer, and
//! docs/architecture.md draws exactly the graph the manifests declare (read with `cargo metadata`). Inside a
//! crate, its modules import one another without a circle.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Each crate's layer: a crate may depend only on crates of a lower one.
fn layer(name: &str) -> usize {
    match name {
        "jointspace-core" => 0,
        "jointspace-embed" | "jointspace-index" | "jointspace-store" => 1,
        "jointspace-service" => 2,
        "jointspace" => 3,
        other => panic!(
            "the workspace crate {other} has no layer here: give it one (and a box in docs/architecture.md)"
        ),
    }
}

/// The workspace's own crates and, for each, the workspace crates it depends on (normal dependencies; the tests
/// and benches may reach further down through dev-dependencies).
fn crate_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(ROOT)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(*d))
                .map(str::to_string)
                .collect();
            (p["name"].as_str().expect("name").to_string(), deps)
        })
        .collect()
}

/// The edges of the crate graph as docs/architecture.md draws it: lines `a --> b` in its first mermaid block.
fn documented_graph() -> BTreeSet<(String, String)> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/architecture.md"))
        .expect("docs/architecture.md");
    let block = doc
        .split("```mermaid")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/architecture.md has a mermaid block with the crate graph");
    block
        .lines()
        .filter_map(|l| l.trim().split_once("-->"))
        .map(|(a, b)| (a.trim().to_string(), b.trim().to_string()))
        .collect()
}

#[test]
fn every_crate_depends_only_on_lower_layers() {
    let graph = crate_graph();
    for name in [
        "jointspace",
        "jointspace-service",
        "jointspace-embed",
        "jointspace-index",
        "jointspace-store",
        "jointspace-core",
    ] {
        assert!(
            graph.contains_key(name),
            "the workspace has no crate {name}: {graph:?}"
        );
    }
    let mut wrong = Vec::new();
    for (name, deps) in &graph {
        for d in deps {
            if layer(d) >= layer(name) {
                wrong.push(format!("{name} -> {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a crate depends on one of its own layer or above (store and index know nothing of each other, the \
         model nothing of either, and nothing below the server sees it): {wrong:?}"
    );
    // The server never reaches the store or the index: only the service sees them.
    let server = &graph["jointspace"];
    assert!(
        !server.contains("jointspace-store") && !server.contains("jointspace-index"),
        "the server crate depends on the store or the index: {server:?}"
    );
}

#[test]
fn docs_draw_the_crate_graph_the_manifests_declare() {
    let actual: BTreeSet<(String, String)> = crate_graph()
        .into_iter()
        .flat_map(|(n, deps)| deps.into_iter().map(move |d| (n.clone(), d)))
        .collect();
    let drawn = documented_graph();
    let missing: Vec<_> = actual.difference(&drawn).collect();
    let stale: Vec<_> = drawn.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's crate graph is out of date: add {missing:?}, remove {stale:?}"
    );
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("read source folder")
        .flatten()
    {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The first identifiers of the paths after each `crate::` in `code` (`crate::{a::b, c}` names a and c).
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = vec![];
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group's top level at its commas.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out
}

/// Each top-level module of the crate whose sources are in `src`, and the other top-level modules its code
/// (tests left out) names through `crate::`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = vec![];
    rust_files(src, &mut files);
    let top = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (!matches!(name, "lib" | "main")).then(|| name.to_string())
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| top(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &files {
        let Some(m) = top(p) else { continue };
        let code = std::fs::read_to_string(p).expect("read source");
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        let uses = graph.entry(m.clone()).or_default();
        for n in crate_paths(code) {
            if n != m && modules.contains(&n) {
                uses.insert(n);
            }
        }
    }
    graph
}

/// A circle in `graph`, if there is one (its modules in order, the first repeated at the end).
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut circle = path[i..].to_vec();
            circle.push(n.to_string());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut vec![], &mut done))
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    // The reader's check works: a circle is found, and a line of imports is not one.
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("labels".into())
        .or_default()
        .insert("projection".into());
    g.entry("projection".into())
        .or_default()
        .insert("fne".into());
    assert_eq!(a_circle(&g), None);
    g.entry("fne".into()).or_default().insert("labels".into());
    assert_eq!(
        a_circle(&g),
        Some(vec![
            "fne".into(),
            "labels".into(),
            "projection".into(),
            "fne".into()
        ])
    );
    assert_eq!(
        crate_paths("use crate::{a::{B, C}, d, e::F};\nlet x = crate::g::h();"),
        vec!["a", "d", "e", "g"]
    );

    let root = Path::new(ROOT);
    let mut sources = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
    {
        sources.push(entry.path().join("src"));
    }
    let mut read = 0;
    for src in sources.iter().filter(|s| s.is_dir()) {
        let graph = module_graph(src);
        read += graph.len();
        if let Some(circle) = a_circle(&graph) {
            panic!(
                "{}: its modules import one another in a circle, {}: move what both need into a module \
                 below them (docs/architecture.md)",
                src.display(),
                circle.join(" -> ")
            );
        }
    }
    assert!(read > 30, "only {read} modules read: the sources moved?");
}
