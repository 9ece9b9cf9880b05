//! The container image's build stage copies every file the server binary is built from: a new crate, module
//! folder or embedded file that the Dockerfile or .dockerignore leaves out fails here in seconds, instead of
//! an image build failing (or a stale one passing) much later. The files come from cargo's dep-info for the
//! binary this test run built (`target/release/jointspace.d`), plus every workspace member's manifest.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The sources of the `COPY` lines (without `--from`) in the Dockerfile's `build` stage.
fn build_stage_copies() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(format!("{ROOT}/Dockerfile")).expect("Dockerfile");
    let mut in_build = false;
    let mut copies = Vec::new();
    for line in dockerfile.lines().map(str::trim) {
        if let Some(from) = line.strip_prefix("FROM ") {
            in_build = from.ends_with(" AS build");
            continue;
        }
        let Some(args) = line.strip_prefix("COPY ").filter(|_| in_build) else {
            continue;
        };
        assert!(
            !line.contains("--from"),
            "the build stage copies from another stage: {line}"
        );
        let args: Vec<&str> = args
            .split_whitespace()
            .filter(|a| !a.starts_with("--"))
            .collect();
        let (_dest, sources) = args.split_last().expect("COPY has a destination");
        copies.extend(sources.iter().map(|s| s.trim_end_matches('/').to_string()));
    }
    assert!(
        !copies.is_empty(),
        "the Dockerfile has no `FROM ... AS build` stage with COPY lines"
    );
    copies
}

/// Whether .dockerignore keeps `rel` in the build context: its patterns in order, the last that matches the
/// path or one of its parent folders decides (`!` keeps); `*` matches within one path segment.
fn in_context(rel: &str, patterns: &[String]) -> bool {
    let mut kept = true;
    for p in patterns {
        let (keep, pat) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        let pat = pat.trim_start_matches('/').trim_end_matches('/');
        let segments: Vec<&str> = rel.split('/').collect();
        let matches = (1..=segments.len()).any(|n| glob(pat, &segments[..n].join("/")));
        if matches {
            kept = keep;
        }
    }
    kept
}

/// `*` matches any run of characters but `/`; everything else literally.
fn glob(pat: &str, path: &str) -> bool {
    match pat.split_once('*') {
        None => pat == path,
        Some((head, tail)) => {
            let Some(rest) = path.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .take_while(|&i| !rest[..i].contains('/'))
                .any(|i| glob(tail, &rest[i..]))
        }
    }
}

/// `..` and `.` resolved by name (the files exist, but the path need not be canonical).
fn normalised(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The files the release binary was built from, relative to the workspace root: the union of rustc's dep-info
/// for the workspace's crates in this build (`deps/{lib,}jointspace*.d`, one per crate and target, each listing
/// that crate's sources, migrations and embedded files), and cargo's own for the binary where a `cargo build`
/// wrote one. Paths that no longer exist (an older build's) are left out.
fn binary_inputs() -> Vec<String> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_jointspace"));
    let dir = bin.parent().expect("the binary's folder");
    let mut dep_infos: Vec<PathBuf> = std::fs::read_dir(dir.join("deps"))
        .expect("the build's deps folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (name.starts_with("jointspace") || name.starts_with("libjointspace"))
                && name.ends_with(".d")
        })
        .collect();
    dep_infos.push(bin.with_extension("d"));
    let root = Path::new(ROOT);
    let mut files = std::collections::BTreeSet::new();
    for d in dep_infos {
        let Ok(text) = std::fs::read_to_string(&d) else {
            continue;
        };
        // Make-style: `target: input input ...` lines (spaces in names escaped), then one `input:` line each.
        for line in text.lines() {
            let Some((_, deps)) = line.split_once(": ") else {
                continue;
            };
            for f in deps.replace("\\ ", "\u{0}").split_whitespace() {
                // rustc names a workspace crate's files relative to the workspace root (cargo runs it there), and
                // an embedded file as its `include_bytes!` wrote it (`src/api/../../web/...`).
                let f = normalised(&root.join(f.replace('\u{0}', " ")));
                if let Ok(rel) = f.strip_prefix(root)
                    && f.exists()
                {
                    files.insert(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    let mut files: Vec<String> = files.into_iter().collect();
    // The manifests and build scripts: dep-info lists sources, and cargo needs every member's Cargo.toml (and
    // build.rs, where one has it) to build.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("Cargo.toml lists the workspace's members");
    files.push("Cargo.lock".to_string());
    let dirs = std::iter::once(".").chain(
        members
            .split(',')
            .map(|m| m.trim().trim_matches('"'))
            .filter(|m| !m.is_empty()),
    );
    for dir in dirs {
        for file in ["Cargo.toml", "build.rs"] {
            let rel = Path::new(dir).join(file);
            if root.join(&rel).exists() {
                files.push(normalised(&rel).to_string_lossy().into_owned());
            }
        }
    }
    files
}

#[test]
fn the_image_build_copies_every_file_the_binary_is_built_from() {
    let copies = build_stage_copies();
    let ignore = std::fs::read_to_string(format!("{ROOT}/.dockerignore")).expect(".dockerignore");
    let patterns: Vec<String> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let inputs = binary_inputs();
    // The binary's own sources, the web page it embeds and a lower crate's sources are all there.
    for must in ["src/main.rs", "web/index.html", "crates/store/src/lib.rs"] {
        assert!(
            inputs.iter().any(|f| f == must),
            "dep-info lacks {must}: {inputs:?}"
        );
    }
    let mut missing = Vec::new();
    for f in &inputs {
        let copied = copies
            .iter()
            .any(|c| c == "." || f == c || f.starts_with(&format!("{c}/")));
        if !copied {
            missing.push(format!("{f} (no COPY in the Dockerfile's build stage)"));
        } else if !in_context(f, &patterns) {
            missing.push(format!(
                "{f} (left out of the build context by .dockerignore)"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "the container image cannot build: the binary is built from files its build stage does not get: \
         {missing:#?}"
    );
}

#[test]
fn the_dockerignore_reading_matches_dockers_for_the_patterns_used() {
    let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let allow = p(&["*", "!src/", "!Cargo.toml"]);
    assert!(in_context("src/api/page.rs", &allow));
    assert!(in_context("Cargo.toml", &allow));
    assert!(!in_context("web/index.html", &allow));
    assert!(!in_context("Cargo.lock", &allow));
    let deny = p(&["target", "*.md", "docs/*.png"]);
    assert!(!in_context("target/release/x", &deny));
    assert!(!in_context("README.md", &deny));
    assert!(in_context("docs/x/README.md", &deny));
    assert!(!in_context("docs/page.png", &deny));
    assert!(in_context("src/main.rs", &deny));
}
