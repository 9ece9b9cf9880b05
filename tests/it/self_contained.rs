//! The README's test command needs only the repository and the registries: no script it runs, and no test,
//! reads a path beside the checkout (the Flickr8k folder of this project's machines, say), except through
//! `scripts/lib.sh`'s `flickr8k_dir`, whose callers fall back to the repository's fixtures when it is absent.
//! `scripts/test.sh` also runs the container stage with that folder hidden.

use std::{
    collections::{BTreeSet, VecDeque},
    path::Path,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Paths outside the repository that a line names outside a comment.
const OUTSIDE: [&str; 2] = ["../shared", "/work/shared"];

/// The one line allowed to name the folder: the default of `flickr8k_dir` in scripts/lib.sh.
fn allowed(file: &str, line: &str) -> bool {
    file == "scripts/lib.sh" && line.trim_start().starts_with("flickr8k_dir()")
}

/// The lines of `text` (a shell, Python or Rust file) that name a path outside the repository in code, as
/// `(line number, line)`; comments may mention such paths as examples.
fn outside_paths(file: &str, text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.trim_start();
            !(code.starts_with('#') || code.starts_with("//") || code.starts_with("\"\"\""))
                && OUTSIDE.iter().any(|p| line.contains(p))
                && !allowed(file, line)
        })
        .map(|(i, line)| (i + 1, line.to_string()))
        .collect()
}

/// The repository's scripts a file runs or sources, by their paths from the root.
fn scripts_named(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || "\"'();|&<>=$`".contains(c)) {
        let word = word.trim_start_matches("./");
        let runnable = word.ends_with(".sh") || word.ends_with(".py");
        if runnable && (word.starts_with("scripts/") || word.starts_with("clients/")) {
            found.push(word.to_string());
        }
    }
    found
}

/// Every script the test command reaches from scripts/test.sh, following what each one runs or sources.
fn reached_from_the_test_command() -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from(["scripts/test.sh".to_string()]);
    while let Some(file) = queue.pop_front() {
        let path = Path::new(ROOT).join(&file);
        if !path.is_file() || !seen.insert(file.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        queue.extend(scripts_named(&text));
    }
    seen
}

/// The test files run by the test command: the server's integration tests, the trainer's and the browser's.
fn test_sources() -> Vec<String> {
    let mut files = Vec::new();
    for dir in [
        "tests/it",
        "tests/it/common",
        "train/tests",
        "tests/browser",
    ] {
        let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            // This file names the paths it looks for.
            if (name.ends_with(".rs") || name.ends_with(".py")) && name != "self_contained.rs" {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    files
}

#[test]
fn the_scanner_finds_a_planted_path_and_passes_comments_and_the_one_default() {
    let planted = "set -e\n# reads ../shared/data/flickr8k when there\nimg=$(head -n 1 ../shared/data/x.txt)\n";
    assert_eq!(
        outside_paths("scripts/x.sh", planted),
        vec![(3, "img=$(head -n 1 ../shared/data/x.txt)".to_string())]
    );
    let lib = "flickr8k_dir() { echo \"${JOINTSPACE_FLICKR8K:-../shared/data/flickr8k}\"; }\n";
    assert!(outside_paths("scripts/lib.sh", lib).is_empty());
    assert_eq!(outside_paths("scripts/other.sh", lib).len(), 1);
    assert_eq!(
        scripts_named(
            "scripts/lib.sh; source scripts/server.sh && (cd x && clients/python/test.sh)"
        ),
        [
            "scripts/lib.sh",
            "scripts/server.sh",
            "clients/python/test.sh"
        ]
    );
}

#[test]
fn the_test_command_reads_nothing_beside_the_checkout() {
    let reached = reached_from_the_test_command();
    for needed in [
        "scripts/lib.sh",
        "scripts/container-smoke.sh",
        "scripts/compose-smoke.sh",
        "scripts/browser-test.sh",
    ] {
        assert!(
            reached.contains(needed),
            "{needed} is not reached from scripts/test.sh: {reached:?}"
        );
    }
    let mut offending = Vec::new();
    for file in reached.iter().cloned().chain(test_sources()) {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&file)).unwrap();
        for (n, line) in outside_paths(&file, &text) {
            offending.push(format!("{file}:{n}: {}", line.trim()));
        }
    }
    assert!(
        offending.is_empty(),
        "the test command must run with only the repository; read such data through scripts/lib.sh's \
         flickr8k_dir and fall back to the fixtures:\n{}",
        offending.join("\n")
    );
}
