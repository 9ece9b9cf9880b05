//! The documentation stays true: product files say what is true now (no round of work or ticket named in them;
//! that history lives in git and CHANGELOG.md), every relative link in README.md and docs/ leads somewhere, the
//! README's commands still parse, and the version the binary and the server report is CHANGELOG.md's latest
//! release.

use std::path::{Path, PathBuf};

use crate::common::TestApp;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Where product text lives. CHANGELOG.md is history by design and is not scanned.
const SCANNED: &[&str] = &[
    "README.md",
    "Dockerfile",
    "Cargo.toml",
    "openapi.yaml",
    ".ci",
    "docs",
    "src",
    "crates",
    "train",
    "scripts",
    "tests",
    "clients",
    "web",
    "deploy",
    "benches",
    "fuzz",
];

/// Never scanned: build outputs, caches and installed dependencies (not product files), and the SQL migrations.
/// sqlx checksums every applied migration at start-up, so editing a committed one, even a comment, makes every
/// existing database refuse to start ("migration was previously applied but has been modified"); they stay as
/// they were written.
const SKIPPED: &[&str] = &[
    "crates/store/migrations",
    "target",
    "node_modules",
    "dist",
    "__pycache__",
    "fuzz/corpus",
    "fuzz/artifacts",
];

fn skipped(rel: &str, name: &str) -> bool {
    (name.starts_with('.') && name != ".ci")
        || SKIPPED
            .iter()
            .any(|s| rel == *s || (!s.contains('/') && name == *s))
}

/// Every text file under the scanned roots, as (path relative to the root, contents).
fn product_files() -> Vec<(String, String)> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        let path = root.join(rel);
        if path.is_dir() {
            let mut entries: Vec<_> = std::fs::read_dir(&path)
                .expect("read_dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            entries.sort();
            for name in entries {
                let child = format!("{rel}/{name}");
                if !skipped(&child, &name) {
                    walk(root, &child, out);
                }
            }
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            // Not UTF-8 (pictures, graphs, weights): not text anyone reads.
            out.push((rel.to_string(), text));
        }
    }
    let mut out = vec![];
    for r in SCANNED {
        if Path::new(ROOT).join(r).exists() {
            walk(Path::new(ROOT), r, &mut out);
        }
    }
    out
}

/// The places in `text` that name a round of work or a ticket by number (the word for either, singular or plural,
/// any case, then a number, with a space, a '#', a '-' or a line break and a comment's leader between), or the
/// tool machines were borrowed through: (line, the words). Words that merely begin the same way ("issued",
/// "sessionid") are not matches; the unit test below plants each form.
fn history_references(text: &str) -> Vec<(usize, String)> {
    let lower = text.to_lowercase();
    let bytes = lower.as_bytes();
    let mut found = vec![];
    let line_of = |at: usize| lower[..at].bytes().filter(|&b| b == b'\n').count() + 1;
    for word in ["session", "issue"] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(word) {
            let start = from + i;
            from = start + word.len();
            if start > 0 && bytes[start - 1].is_ascii_alphanumeric() {
                continue;
            }
            let mut j = start + word.len();
            if bytes.get(j) == Some(&b's') {
                j += 1;
            }
            // A space, a line break with a comment's leader, or '#', then a number.
            let gap_start = j;
            while j < bytes.len() && b" \t\r\n/*!#-".contains(&bytes[j]) {
                j += 1;
            }
            if j > gap_start && bytes.get(j).is_some_and(u8::is_ascii_digit) {
                while bytes.get(j).is_some_and(u8::is_ascii_digit) {
                    j += 1;
                }
                found.push((line_of(start), lower[start..j].replace('\n', " ")));
            }
        }
    }
    // Split so that this file passes its own scan.
    for phrase in [
        ["device", " tool"],
        ["lent", " machine"],
        ["machine was", " lent"],
    ]
    .map(|p| p.concat())
    {
        let phrase = phrase.as_str();
        let mut from = 0;
        while let Some(i) = lower[from..].find(phrase) {
            found.push((line_of(from + i), phrase.to_string()));
            from += i + phrase.len();
        }
    }
    found.sort();
    found
}

#[test]
fn the_scanner_finds_what_it_must_and_passes_innocent_words() {
    // Built at run time so that this file itself passes the scan.
    let s = "sess".to_string() + "ion";
    let i = "iss".to_string() + "ue";
    for planted in [
        format!("measured in {s} 12 on the server"),
        format!("({s}s 27-28)"),
        format!("# {} 3: later", s.to_uppercase()),
        format!("the bar of {i} 44"),
        format!("see {i} #42"),
        format!("{i}s 4 and 5"),
        format!("as before {s}\n/// 28, the default"),
        format!("run through the {}", "device ".to_string() + "tool"),
    ] {
        assert_eq!(
            history_references(&planted).len(),
            1,
            "not found in {planted:?}"
        );
    }
    for innocent in [
        "a token issued 3 days ago",
        "the ONNX Runtime session (one per graph)",
        "Issues and pull requests welcome",
        "sessionid 4",
        "issue: 4xx answers",
        "a 2-session soak",
    ] {
        assert_eq!(history_references(innocent), vec![], "{innocent:?}");
    }
    assert_eq!(
        history_references("a\nb\nsession 9")[0].0,
        3,
        "line numbers"
    );
}

#[test]
fn no_product_file_names_a_session_or_an_issue() {
    let files = product_files();
    assert!(
        files.iter().any(|(p, _)| p == "src/main.rs") && files.len() > 100,
        "the walk found the product files ({} files)",
        files.len()
    );
    let mut bad = vec![];
    for (path, text) in &files {
        for (line, words) in history_references(text) {
            bad.push(format!("{path}:{line}: {words}"));
        }
    }
    assert!(
        bad.is_empty(),
        "product files say what is true now; how it came to be belongs in git history and CHANGELOG.md:\n{}",
        bad.join("\n")
    );
}

/// The markdown files a reader follows links through.
fn markdown_files() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut files = vec![
        root.join("README.md"),
        root.join("CHANGELOG.md"),
        root.join("train/README.md"),
    ];
    for dir in ["docs", "clients/python", "clients/typescript"] {
        let mut in_dir: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .expect("read_dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    files
}

/// The text outside fenced code blocks and inline code spans, with line numbers.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut prose = String::new();
        for (k, part) in line.split('`').enumerate() {
            if k % 2 == 0 {
                prose.push_str(part);
            }
        }
        out.push((n + 1, prose));
    }
    out
}

/// GitHub's anchors for a file's headings: the heading's text lowercased, kept only letters, digits, spaces,
/// '-' and '_', spaces made '-', and a repeated anchor numbered -1, -2, ...
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = vec![];
    let mut bases: Vec<String> = vec![];
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        // The rendered text: a link's text without its target, code without its backticks.
        let mut rendered = String::new();
        let mut rest = title;
        while let Some(open) = rest.find("](") {
            let close = rest[open..].find(')').map_or(rest.len(), |c| open + c + 1);
            rendered.push_str(&rest[..open]);
            rest = &rest[close..];
        }
        rendered.push_str(rest);
        let slug: String = rendered
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = bases.iter().filter(|b| **b == slug).count();
        let unique = if n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        };
        bases.push(slug);
        seen.push(unique);
    }
    seen
}

/// The targets of `[text](target)` links in a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_string());
        rest = &after[end..];
    }
    out
}

/// The problems with one link from `from` (a markdown file), or none.
fn broken_link(from: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let path = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a folder").join(file)
    };
    if !path.exists() {
        return Some(format!("{} does not exist", path.display()));
    }
    if !anchor.is_empty() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !anchors(&text).iter().any(|a| a == anchor) {
            return Some(format!(
                "no heading of {} has the anchor #{anchor}",
                path.display()
            ));
        }
    }
    None
}

#[test]
fn the_link_checker_catches_what_it_must() {
    let text = "# Open vocabulary\n## The fast bundle: EfficientNet-Lite2 FNE\n## `jointspace sync`\n## Open vocabulary\n```\n# not a heading\n```\n";
    assert_eq!(
        anchors(text),
        [
            "open-vocabulary",
            "the-fast-bundle-efficientnet-lite2-fne",
            "jointspace-sync",
            "open-vocabulary-1"
        ]
    );
    assert_eq!(
        link_targets("see [the API](docs/api.md#sync) and [x](https://e.org/a) (not a link)"),
        ["docs/api.md#sync", "https://e.org/a"]
    );
    let readme = Path::new(ROOT).join("README.md");
    assert_eq!(broken_link(&readme, "docs/api.md"), None);
    assert!(broken_link(&readme, "docs/no-such-file.md").is_some());
    assert!(broken_link(&readme, "docs/api.md#no-such-heading").is_some());
    assert_eq!(broken_link(&readme, "https://example.org/x"), None);
}

/// The titles a file's sections can be cited by: its headings, and the bold words that open a paragraph or a
/// list item (`**The hubness section.**`), lowercased with their whitespace collapsed.
fn section_titles(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let title = if line.starts_with('#') {
            Some(line.trim_start_matches('#'))
        } else {
            t.trim_start_matches("- ")
                .strip_prefix("**")
                .and_then(|rest| rest.split("**").next())
        };
        if let Some(title) = title {
            out.push(collapse(title).to_lowercase());
        }
    }
    out
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A section cited in prose as `docs/NAME.md, "Title"` (or `NAME.md "Title"`): (line, file as written, title).
fn section_citations(text: &str) -> Vec<(usize, String, String)> {
    let mut out = vec![];
    let mut from = 0;
    while let Some(i) = text[from..].find(".md") {
        let end = from + i + 3;
        from = end;
        let start = text[..end - 3]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || "_./-".contains(*c)))
            .map_or(0, |(k, c)| k + c.len_utf8());
        let file = &text[start..end];
        let rest = text[end..].trim_start_matches(')').trim_start_matches(',');
        let rest = rest.trim_start();
        let gap = text.len() - end - rest.len();
        let Some(quoted) = rest.strip_prefix('"') else {
            continue;
        };
        // A citation follows its file on the same line or the next, and its title is short.
        if text[end..end + gap].matches('\n').count() > 1 {
            continue;
        }
        let Some(close) = quoted.find('"') else {
            continue;
        };
        if file.len() <= 3 || close > 200 {
            continue;
        }
        let line = text[..start].matches('\n').count() + 1;
        out.push((line, file.to_string(), collapse(&quoted[..close])));
    }
    out
}

#[test]
fn the_section_citation_checker_catches_what_it_must() {
    let text = "as docs/bundle.md, \"The hubness\nsection\" says, and README.md (no title), and (docs/x.md, \"Y\")";
    assert_eq!(
        section_citations(text),
        [
            (
                1,
                "docs/bundle.md".to_string(),
                "The hubness section".to_string()
            ),
            (2, "docs/x.md".to_string(), "Y".to_string())
        ]
    );
    let titles = section_titles(
        "# Storage\n**The hubness section.** text\n- **Dry run.** x\n```\n# no\n```\n",
    );
    assert_eq!(titles, ["storage", "the hubness section.", "dry run."]);
}

#[test]
fn every_section_cited_by_title_exists() {
    let root = Path::new(ROOT);
    let mut bad = vec![];
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (line, cited, title) in section_citations(&text) {
            let candidates = [
                file.parent().expect("a folder").join(&cited),
                root.join(&cited),
                root.join("docs")
                    .join(Path::new(&cited).file_name().expect("a name")),
            ];
            let rel = file.strip_prefix(ROOT).unwrap_or(&file).display();
            let Some(target) = candidates.iter().find(|c| c.is_file()) else {
                bad.push(format!("{rel}:{line}: {cited} does not exist"));
                continue;
            };
            checked += 1;
            let titles = section_titles(&std::fs::read_to_string(target).unwrap_or_default());
            let wanted = title.to_lowercase();
            if !titles.iter().any(|t| t.contains(&wanted)) {
                bad.push(format!(
                    "{rel}:{line}: {cited} has no section titled \"{title}\""
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "{checked} citations found: is the parser right?"
    );
    assert!(
        bad.is_empty(),
        "sections cited by a title that no heading has:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let mut bad = vec![];
    let mut checked = 0;
    for file in markdown_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            bad.push(format!("{} is missing", file.display()));
            continue;
        };
        for (n, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                checked += 1;
                if let Some(why) = broken_link(&file, &target) {
                    let rel = file.strip_prefix(ROOT).unwrap_or(&file).display();
                    bad.push(format!("{rel}:{n}: ({target}) {why}"));
                }
            }
        }
    }
    assert!(checked > 20, "{checked} links found: is the parser right?");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// The README's shell blocks, line by line (a line ending in '\' joined to the next).
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let mut out = vec![];
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && (t == "```sh" || t == "```bash" || t == "```shell");
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = t.split(" #").next().unwrap_or("").trim_end();
        if code.starts_with('#') || code.is_empty() {
            continue;
        }
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        out.push(std::mem::take(&mut pending));
    }
    out
}

/// For a command line naming the binary: the subcommand words (`["bundle", "inspect"]`), after any leading
/// `NAME=value` settings; None for other lines.
fn subcommand_of(line: &str) -> Option<Vec<String>> {
    let mut words = line
        .split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'));
    let bin = words.next()?;
    if ![
        "jointspace",
        "target/release/jointspace",
        "./target/release/jointspace",
    ]
    .contains(&bin)
    {
        return None;
    }
    Some(
        words
            .take_while(|w| {
                w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-')
            })
            .map(str::to_string)
            .collect(),
    )
}

#[test]
fn the_readme_commands_still_parse() {
    assert_eq!(
        subcommand_of("JOINTSPACE_BUNDLE=x jointspace bundle inspect models/x --graphs"),
        Some(vec!["bundle".to_string(), "inspect".to_string()])
    );
    assert_eq!(subcommand_of("curl -s localhost:8080/healthz"), None);
    let commands = readme_commands();
    assert!(
        commands.iter().any(|c| c == "scripts/serve.sh")
            && commands.iter().any(|c| c == "scripts/test.sh"),
        "the README shows its two commands: {commands:?}"
    );
    let mut checked = 0;
    for line in &commands {
        for word in line.split(|c: char| c.is_whitespace() || c == ';' || c == '(' || c == ')') {
            if word.starts_with("scripts/") && word.ends_with(".sh") {
                let path = Path::new(ROOT).join(word);
                let mode = std::fs::metadata(&path).map(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode()
                });
                assert!(
                    mode.is_ok_and(|m| m & 0o111 != 0),
                    "README: `{line}` names {word}, which is not an executable file"
                );
                checked += 1;
            }
        }
        let Some(sub) = subcommand_of(line) else {
            continue;
        };
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_jointspace"))
            .args(&sub)
            .arg("--help")
            .output()
            .expect("runs");
        assert!(
            out.status.success() && !sub.is_empty(),
            "README: `{line}`: `jointspace {} --help` fails: {}",
            sub.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 3, "{checked} commands checked in {commands:?}");
}

/// CHANGELOG.md's newest release (the first `## [x.y.z]` heading after `## [Unreleased]`).
fn changelog_release() -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join("CHANGELOG.md")).expect("CHANGELOG.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .filter_map(|l| l.split(']').next())
        .find(|v| *v != "Unreleased")
        .expect("a release in CHANGELOG.md")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_and_the_server_report_the_changelogs_release() {
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(changelog_release(), version, "CHANGELOG.md and Cargo.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jointspace"))
        .arg("--version")
        .output()
        .expect("runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("jointspace {version}")
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let app = TestApp::start(&dir.path().join("v.db"), &[]).await;
    let (status, body) = app.get_json("/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], version, "{body}");
    app.stop().await;
}
