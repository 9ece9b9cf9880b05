//! The `jointspace` binary's commands, as scripts call them.

use crate::common;

use std::process::Command;

fn jointspace() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jointspace"));
    c.env("JOINTSPACE_BUNDLE", common::BUNDLE)
        .env("RUST_LOG", "warn");
    c
}

fn run(c: &mut Command) -> String {
    let out = c.output().expect("runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{c:?} failed\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout.into_owned()
}

/// A Flickr8k-shaped dataset made of the fixture pictures.
fn dataset(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("images")).expect("dir");
    let mut tokens = String::new();
    let mut test = String::new();
    for i in 0..8 {
        let name = format!("p{i}.png");
        std::fs::write(dir.join("images").join(&name), common::fixture_image(i)).expect("write");
        for k in 0..5 {
            tokens.push_str(&format!(
                "{name}#{k}\tA picture number {i} , caption {k} .\n"
            ));
        }
        test.push_str(&format!("{name}\n"));
    }
    tokens.push_str("missing.jpg.1#0\tA caption whose image does not exist .\n");
    std::fs::write(dir.join("Flickr8k.token.txt"), tokens).expect("write");
    std::fs::write(dir.join("Flickr_8k.testImages.txt"), test).expect("write");
}

#[test]
fn ingest_eval_inspect_and_reindex() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("flickr");
    dataset(&data);
    let url = format!("sqlite://{}/db/js.db", dir.path().display());

    let out = run(jointspace()
        .args(["ingest", "--images"])
        .arg(data.join("images"))
        .arg("--captions")
        .arg(data.join("Flickr8k.token.txt"))
        .args([
            "--collection",
            "flickr",
            "--batch",
            "3",
            "--database-url",
            &url,
        ]));
    assert!(out.contains("8 images in collection \"flickr\""), "{out}");
    // The database file alone holds the run: its WAL was checkpointed and emptied at the end, so a copy of
    // the file (a prepared database moved into place, a backup) misses nothing.
    let db = dir.path().join("db/js.db");
    let wal = dir.path().join("db/js.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "a WAL with writes was left beside the database"
    );
    let copy = dir.path().join("copy.db");
    std::fs::copy(&db, &copy).expect("copy the file alone");
    let counts = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            sqlx::any::install_default_drivers();
            let db = sqlx::AnyPool::connect(&format!("sqlite://{}", copy.display()))
                .await
                .expect("open the copy");
            let n = |t: &'static str| {
                let db = db.clone();
                async move {
                    sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {t}"))
                        .fetch_one(&db)
                        .await
                        .expect("count")
                }
            };
            (n("images").await, n("captions").await)
        });
    assert_eq!(counts, (8, 40));
    // Again: nothing is added twice, and nothing stored is embedded again (the same names, now unreadable as
    // images, would fail the run if they were decoded).
    let stored = dir.path().join("stored");
    std::fs::create_dir_all(&stored).expect("dir");
    for e in std::fs::read_dir(data.join("images")).expect("images") {
        std::fs::write(stored.join(e.expect("entry").file_name()), b"not an image").expect("write");
    }
    let out = run(jointspace()
        .args(["ingest", "--images"])
        .arg(&stored)
        .args(["--collection", "flickr", "--database-url", &url]));
    assert!(out.contains("8 images"), "{out}");
    // A photo that does not decode leaves its batch and is reported; the rest of the batch is stored.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(&mixed).expect("dir");
    for i in 0..3 {
        std::fs::write(mixed.join(format!("m{i}.png")), common::fixture_image(i)).expect("write");
    }
    std::fs::write(mixed.join("bad.jpg"), b"not an image").expect("write");
    let out = run(jointspace().args(["ingest", "--images"]).arg(&mixed).args([
        "--collection",
        "mixed",
        "--batch",
        "4",
        "--database-url",
        &url,
    ]));
    assert!(out.contains("3 images in collection \"mixed\""), "{out}");
    assert!(
        out.contains("1 photos skipped:") && out.contains("  bad.jpg: "),
        "{out}"
    );

    let out = run(jointspace()
        .args(["eval", "--split", "test", "--json", "--data"])
        .arg(&data));
    let v: serde_json::Value = serde_json::from_str(&out).expect("eval --json prints JSON");
    assert_eq!(v["images"], 8);
    assert_eq!(v["captions"], 40);
    for k in [
        "i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr",
        "rsum",
    ] {
        assert!(v["metrics"][k].is_number(), "{k} in {v}");
    }
    // With 8 images, every caption finds its image in the top 10; an image's captions rank within 40.
    assert_eq!(v["metrics"]["t2i_r10"], 100.0);
    assert!(v["metrics"]["i2t_medr"].as_f64().expect("medr") <= 40.0);
    let out = run(jointspace()
        .args(["eval", "--split", "test", "--data"])
        .arg(&data));
    assert!(out.contains("rsum"), "{out}");

    let out = run(jointspace().args(["bundle", "inspect", common::BUNDLE, "--graphs"]));
    assert!(
        out.contains("fixture-tiny@") && out.contains("verified"),
        "{out}"
    );

    // Under the bundle that made every vector there is nothing to recompute.
    let out = run(jointspace().args(["reindex", "--database-url", &url]));
    assert!(
        out.contains("reindexed 0 images") && out.contains("0 captions"),
        "{out}"
    );

    let bad = jointspace()
        .args(["bundle", "inspect", "/nonexistent"])
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bundle.json"));
}

#[test]
fn eval_asks_for_its_dataset_instead_of_guessing_a_path() {
    let out = jointspace()
        .env_remove("JOINTSPACE_EVAL_DATA")
        .args(["eval", "--split", "test"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "eval without --data must fail");
    assert!(
        stderr.contains("--data (or JOINTSPACE_EVAL_DATA)"),
        "{stderr}"
    );
    let out = jointspace()
        .env("JOINTSPACE_EVAL_DATA", "/nonexistent/flickr8k")
        .args(["eval", "--split", "test"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/nonexistent/flickr8k: no such folder"),
        "{stderr}"
    );
}

/// The scripts' default bundle (scripts/lib.sh, what `scripts/serve.sh` serves and the image carries) is the
/// server's own `--bundle` default, so that one switch of the default cannot leave the other behind.
#[test]
fn the_scripts_serve_the_servers_default_bundle() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lib.sh"))
        .expect("scripts/lib.sh");
    let scripts = lib
        .lines()
        .find_map(|l| l.strip_prefix("DEFAULT_BUNDLE="))
        .expect("scripts/lib.sh sets DEFAULT_BUNDLE");
    let help = run(jointspace()
        .env_remove("JOINTSPACE_BUNDLE")
        .args(["serve", "--help"]));
    assert!(
        help.contains(&format!("[default: {scripts}]")),
        "serve --help does not give {scripts} as --bundle's default:\n{help}"
    );
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile"))
        .expect("Dockerfile");
    assert!(
        dockerfile.contains(&format!("JOINTSPACE_BUNDLE=/opt/jointspace/{scripts} ")),
        "the image serves another bundle than {scripts}"
    );
}
