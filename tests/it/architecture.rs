//! The crate graph is the architecture: each workspace crate depends only on crates of a lower layer, and
//! docs/architecture.md draws exactly the graph the manifests declare (read with `cargo metadata`).

use std::{
    collections::{BTreeMap, BTreeSet},
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
