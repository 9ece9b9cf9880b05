//! `jointspace sync` on both engines, one catalogue's life: a dry run that writes nothing, the first sync,
//! a rerun that changes nothing, a text-only change written without a CNN pass (same image id), a feed that
//! withdraws too much refused with nothing written, a dry run then the real run of a new photo, a new item
//! and withdrawals, the same catalogue as JSON lines with photos at URLs, bad lines named and refused, and a
//! photo that cannot be read stopping the sync (or left out with --skip-failed). And a database made under
//! one bundle synced again under a bundle of another vision model: every photo embedded again, once. And a
//! feed of products with several photos into a collection grouped by product.
//!
//! "Without a CNN pass" is read from the service's own counter of photos the vision model embedded
//! (`jointspace_embedded_items{kind="image"}`, counted where the pipeline runs), which the report carries,
//! and checked against the store: an updated image keeps its id, a replaced one gets a new one.

use std::{collections::BTreeMap, path::Path};

use jointspace_core::filter::Filter;
use jointspace_store::Store;
use serde_json::{Value, json};

use crate::common::{self, BUNDLE, fixture_image, jointspace, pg::PgCluster};
use crate::url_ingest::origin;

/// What the collection holds: external id -> (image id, metadata, captions sorted); empty without it.
async fn state(url: &str) -> BTreeMap<String, (i64, Value, Vec<String>)> {
    let store = Store::connect(url).await.expect("store");
    let mut out = BTreeMap::new();
    if let Ok(c) = store.collection("shop").await {
        let rows = store
            .list_images(c.id, &Filter::all(), 0, 1000)
            .await
            .expect("images");
        for r in rows {
            let mut caps: Vec<String> = store
                .list_captions(c.id, Some(r.id), 0, 100)
                .await
                .expect("captions")
                .into_iter()
                .map(|c| c.text)
                .collect();
            caps.sort();
            out.insert(r.external_id.expect("synced"), (r.id, r.metadata, caps));
        }
    }
    store.close().await;
    out
}

/// Runs `jointspace sync` on `feed` (in `dir`) into "shop": whether it succeeded, its output and its JSON
/// report (Null when it wrote none).
fn sync(db: &str, dir: &Path, feed: &str, extra: &[&str]) -> (bool, String, Value) {
    sync_with(BUNDLE, db, dir, feed, extra)
}

/// As `sync`, under the bundle at `bundle`.
fn sync_with(
    bundle: &str,
    db: &str,
    dir: &Path,
    feed: &str,
    extra: &[&str],
) -> (bool, String, Value) {
    let report = dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut c = jointspace(db);
    c.env("JOINTSPACE_BUNDLE", bundle)
        .args(["sync", "--collection", "shop", "--feed"])
        .arg(dir.join(feed))
        .arg("--report")
        .arg(&report)
        .args(extra);
    let (ok, out) = common::outcome(&c.output().expect("runs"));
    let report = std::fs::read(&report)
        .map(|b| serde_json::from_slice(&b).expect("the report is JSON"))
        .unwrap_or(Value::Null);
    (ok, out, report)
}

/// The report's counts: added, replaced, updated, unchanged, deleted, failed, photos embedded.
pub(crate) fn counts(r: &Value) -> [i64; 7] {
    let n = |k: &str| r[k].as_i64().unwrap_or(-1);
    [
        n("added"),
        n("replaced"),
        n("updated"),
        n("unchanged"),
        n("deleted"),
        r["failed"].as_array().map_or(-1, |f| f.len() as i64),
        n("photos_embedded"),
    ]
}

const FEED_1: &str = "id,title,description,image,price,captions
sku-1,Red shoe,\"A red shoe, leather\",photos/p0.png,39.5,a red shoe|a shoe on grass
sku-2,Blue bag,A bag,photos/p1.png,20,
sku-3,Straw hat,\"Woven
by hand\",photos/p2.png,5,a hat
sku-4,Scarf,,photos/p3.png,12,
sku-5,Gloves,,photos/p4.png,8,
";

/// FEED_1 with new text for sku-1 (title, one caption fewer) and a new price for sku-2: same photos.
const FEED_2: &str = "id,title,description,image,price,captions
sku-1,Crimson shoe,\"A red shoe, leather\",photos/p0.png,39.5,a red shoe
sku-2,Blue bag,A bag,photos/p1.png,18,
sku-3,Straw hat,\"Woven
by hand\",photos/p2.png,5,a hat
sku-4,Scarf,,photos/p3.png,12,
sku-5,Gloves,,photos/p4.png,8,
";

/// FEED_2 with a new photo for sku-2, a new sku-6, and sku-4 and sku-5 withdrawn (2 of 5: 40%).
const FEED_3: &str = "id,title,description,image,price,captions
sku-1,Crimson shoe,\"A red shoe, leather\",photos/p0.png,39.5,a red shoe
sku-2,Blue bag,A bag,photos/p5.png,18,
sku-3,Straw hat,\"Woven
by hand\",photos/p2.png,5,a hat
sku-6,Belt,,photos/p6.png,15,
";

async fn feed_life(db: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir(d.join("photos")).expect("mkdir");
    for i in 0..8 {
        std::fs::write(d.join(format!("photos/p{i}.png")), fixture_image(i)).expect("photo");
    }
    for (name, body) in [
        ("feed1.csv", FEED_1),
        ("feed2.csv", FEED_2),
        ("feed3.csv", FEED_3),
    ] {
        std::fs::write(d.join(name), body).expect("feed");
    }
    let csv = ["--number-fields", "price"];

    // A dry run against a collection --create would make: every item would be added, nothing is.
    let (ok, out, r) = sync(
        db,
        d,
        "feed1.csv",
        &[&csv[..], &["--create", "--dry-run"]].concat(),
    );
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [5, 0, 0, 0, 0, 0, 0], "{r}");
    assert_eq!(r["dry_run"], true);
    // Lines are the feed's, a quoted line break included (sku-3's description spans lines 4 and 5).
    assert!(out.contains("would add sku-1 (line 2)"), "{out}");
    assert!(out.contains("would add sku-4 (line 6)"), "{out}");
    assert!(out.contains("nothing was written"), "{out}");
    assert!(state(db).await.is_empty(), "a dry run creates nothing");

    // Without --create, a missing collection is named.
    let (ok, out, _) = sync(db, d, "feed1.csv", &csv);
    assert!(!ok && out.contains("--create"), "{out}");

    // The first sync: every photo embedded once; title, description and price in metadata.
    let (ok, out, r) = sync(db, d, "feed1.csv", &[&csv[..], &["--create"]].concat());
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [5, 0, 0, 0, 0, 0, 5], "{r}");
    assert!(out.contains("5 added"), "{out}");
    let first = state(db).await;
    assert_eq!(first.len(), 5);
    let (_, meta, caps) = &first["sku-1"];
    assert_eq!(
        meta,
        &json!({"title": "Red shoe", "description": "A red shoe, leather", "price": 39.5})
    );
    assert_eq!(caps, &["a red shoe", "a shoe on grass"]);
    assert_eq!(first["sku-3"].1["description"], "Woven\nby hand");
    assert_eq!(
        first["sku-4"].1,
        json!({"title": "Scarf", "price": 12}),
        "an empty cell is no key"
    );

    // Run again: nothing written, nothing embedded.
    let (ok, out, r) = sync(db, d, "feed1.csv", &csv);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 5, 0, 0, 0], "{r}");
    assert_eq!(r["sentences_embedded"], 0, "{r}");
    assert_eq!(r["changes"], json!([]));
    assert_eq!(state(db).await, first);

    // Text and attributes only: written without the CNN, the images keep their ids.
    let (ok, out, r) = sync(db, d, "feed2.csv", &csv);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 2, 3, 0, 0, 0], "{r}");
    assert_eq!(
        r["sentences_embedded"], 0,
        "the caption sku-1 keeps is not embedded again: {r}"
    );
    let second = state(db).await;
    assert_eq!(second["sku-1"].0, first["sku-1"].0, "same photo, same id");
    assert_eq!(second["sku-1"].1["title"], "Crimson shoe");
    assert_eq!(second["sku-1"].2, ["a red shoe"]);
    assert_eq!(second["sku-2"].0, first["sku-2"].0);
    assert_eq!(second["sku-2"].1["price"], 18);
    assert_eq!(second["sku-5"], first["sku-5"]);

    // A feed that withdraws 2 of 5 (40%) passes the default share (0.2): refused, nothing written, not
    // even its new photo or its new item.
    let (ok, out, r) = sync(db, d, "feed3.csv", &csv);
    assert!(!ok, "{out}");
    assert!(
        out.contains("leaves out 2 of the 5 items") && out.contains("(40.0%)"),
        "{out}"
    );
    assert!(out.contains("--max-delete-share 0.40 or more"), "{out}");
    assert!(
        r["refused"].as_str().is_some_and(|s| s.contains("40.0%")),
        "{r}"
    );
    assert_eq!(state(db).await, second);

    // Its dry run with the share raised: what it would do, and nothing done.
    let allow = ["--number-fields", "price", "--max-delete-share", "0.4"];
    let (ok, out, r) = sync(db, d, "feed3.csv", &[&allow[..], &["--dry-run"]].concat());
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [1, 1, 0, 2, 2, 0, 0], "{r}");
    for line in [
        "would replace sku-2 (line 3)",
        "would add sku-6 (line 6)",
        "would delete sku-4",
        "would delete sku-5",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert_eq!(state(db).await, second);

    // The real run: the new photo embedded under a new id, the new item added, the withdrawn deleted.
    let (ok, out, r) = sync(db, d, "feed3.csv", &allow);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [1, 1, 0, 2, 2, 0, 2], "{r}");
    let third = state(db).await;
    assert_eq!(
        third.keys().collect::<Vec<_>>(),
        ["sku-1", "sku-2", "sku-3", "sku-6"]
    );
    assert_ne!(third["sku-2"].0, second["sku-2"].0, "a new photo, a new id");
    assert_eq!(third["sku-2"].1, second["sku-2"].1);
    assert_eq!(third["sku-1"], second["sku-1"]);
    let (ok, out, r) = sync(db, d, "feed3.csv", &allow);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 4, 0, 0, 0], "rerun: {r}");
    assert_eq!(state(db).await, third);

    // The same catalogue as JSON lines (numbers typed by JSON), sku-6's photo and a new sku-7's at URLs:
    // the URL's bytes are sku-6's, so it is unchanged; a feed that withdraws nothing passes a share of 0.
    let images = origin("127.0.0.1").await;
    let lines = [
        json!({"id": "sku-1", "title": "Crimson shoe", "description": "A red shoe, leather",
               "image": "photos/p0.png", "price": 39.5, "captions": ["a red shoe"]}),
        json!({"id": "sku-2", "title": "Blue bag", "description": "A bag", "image": "photos/p5.png",
               "price": 18}),
        json!({"id": "sku-3", "title": "Straw hat", "description": "Woven\nby hand",
               "image": "photos/p2.png", "price": 5, "captions": "a hat"}),
        json!({"id": "sku-6", "title": "Belt", "image": images.url("/img/6.png"), "price": 15}),
        json!({"id": "sku-7", "title": "Tie", "image": images.url("/img/7.png"), "price": 9}),
    ];
    let jsonl: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(d.join("feed.jsonl"), jsonl.join("\n")).expect("feed");
    let (ok, out, _) = sync(db, d, "feed.jsonl", &[]);
    assert!(!ok && out.contains("pass --url-ingest"), "{out}");
    let fetch = [
        "--url-ingest",
        "--url-ingest-allow",
        "127.0.0.1/32",
        "--max-delete-share",
        "0",
    ];
    let (ok, out, r) = sync(db, d, "feed.jsonl", &fetch);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [1, 0, 0, 4, 0, 0, 1], "{r}");
    let fourth = state(db).await;
    assert_eq!(fourth["sku-6"], third["sku-6"]);
    assert_eq!(fourth["sku-7"].1, json!({"title": "Tie", "price": 9}));

    // Bad lines are named, all of them, and nothing is written (not even line 1's new item).
    let bad = [
        json!({"id": "sku-8", "image": "photos/p3.png"}).to_string(),
        json!({"id": "sku-9", "title": "no photo"}).to_string(),
        "{\"id\": \"sku-10\", \"image\": ".to_string(),
        json!({"id": "sku-8", "image": "photos/p4.png"}).to_string(),
    ];
    std::fs::write(d.join("bad.jsonl"), bad.join("\n")).expect("feed");
    let (ok, out, _) = sync(db, d, "bad.jsonl", &["--max-delete-share", "1"]);
    assert!(!ok, "{out}");
    for want in [
        "bad.jsonl:2: no `image`",
        "bad.jsonl:3: not JSON",
        "bad.jsonl:4: the id \"sku-8\" again (first on line 1)",
        "3 bad line(s)",
        "nothing was written",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    std::fs::write(
        d.join("bad.csv"),
        "id,image,price\nsku-8,photos/p3.png,cheap\n",
    )
    .expect("feed");
    let (ok, out, _) = sync(db, d, "bad.csv", &["--number-fields", "price"]);
    assert!(
        !ok && out.contains("bad.csv:2: `price` is \"cheap\", not a number"),
        "{out}"
    );
    assert_eq!(state(db).await, fourth);

    // A photo that cannot be read stops the sync at its line and deletes nothing; --skip-failed leaves it
    // out and goes on.
    let mut broken = jsonl.clone();
    broken.push(json!({"id": "sku-8", "image": "photos/missing.png"}).to_string());
    std::fs::write(d.join("broken.jsonl"), broken.join("\n")).expect("feed");
    let (ok, out, r) = sync(db, d, "broken.jsonl", &fetch);
    assert!(!ok, "{out}");
    assert!(
        out.contains("broken.jsonl:6: sku-8: cannot read") && out.contains("stopped there"),
        "{out}"
    );
    assert_eq!(r["failed"][0]["line"], 6, "{r}");
    let (ok, out, r) = sync(
        db,
        d,
        "broken.jsonl",
        &[&fetch[..], &["--skip-failed"]].concat(),
    );
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 5, 0, 1, 0], "{r}");
    assert_eq!(r["failed"][0]["external_id"], "sku-8");
    assert_eq!(state(db).await, fourth);
}

/// A bundle with the fixture's joint space (the same W, text model and dimensions) whose vision model reads
/// the ten crops off two whole-image passes: another vision id, so the fixture's codes are not its own.
const WINDOWED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/fixture-tiny-windowed");

/// The stored images' and captions' provenance: (bundle id, vision id, count), (bundle id, count).
async fn provenance(url: &str) -> (Vec<(String, String, i64)>, Vec<(String, i64)>) {
    let store = Store::connect(url).await.expect("store");
    let p = (
        store.image_provenance().await.expect("images"),
        store.caption_provenance().await.expect("captions"),
    );
    store.close().await;
    p
}

/// A catalogue synced under the fixture bundle, then under a bundle of another vision model (as when the
/// default bundle changes its vision graph): the start-up warning says to sync, the sync embeds every photo
/// again (same bytes, another model's codes) under new ids, with its captions, and a rerun changes nothing.
async fn reembed_life(db: &str) {
    eprintln!("re-embedding on {db}");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir(d.join("photos")).expect("mkdir");
    for i in 0..5 {
        std::fs::write(d.join(format!("photos/p{i}.png")), fixture_image(i)).expect("photo");
    }
    std::fs::write(d.join("feed1.csv"), FEED_1).expect("feed");
    let csv = ["--number-fields", "price"];
    let load = |b: &str| jointspace_embed::bundle::Bundle::load(Path::new(b)).expect("bundle");
    let (old, new) = (load(BUNDLE), load(WINDOWED));
    assert_ne!(
        old.vision_id, new.vision_id,
        "the test needs two vision models"
    );

    let (ok, out, r) = sync(db, d, "feed1.csv", &[&csv[..], &["--create"]].concat());
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [5, 0, 0, 0, 0, 0, 5], "{r}");
    let before = state(db).await;

    // The same feed under the other vision model: the dry run says what it would embed again, and embeds
    // nothing; the start-up warning names the way out.
    let (ok, out, r) = sync_with(
        WINDOWED,
        db,
        d,
        "feed1.csv",
        &[&csv[..], &["--dry-run"]].concat(),
    );
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 0, 0, 0, 0], "{r}");
    assert_eq!(r["reembedded"], 5, "{r}");
    assert!(out.contains("would reembed sku-1 (line 2)"), "{out}");
    assert!(
        out.contains("5 would be re-embedded (coded by another vision model)"),
        "{out}"
    );
    for want in [
        "images were embedded with another bundle",
        "`jointspace reindex` cannot recompute them",
        "jointspace sync --collection <name> --feed <your catalogue feed>",
        "captions were embedded with another bundle; the sync that re-embeds the images re-embeds their \
         captions",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert_eq!(state(db).await, before);

    // The real run: every photo embedded again by the loaded model, under a new id, with the same metadata
    // and captions; the captions embedded again too (their vectors were the other bundle's).
    let (ok, out, r) = sync_with(WINDOWED, db, d, "feed1.csv", &csv);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 0, 0, 0, 5], "{r}");
    assert_eq!(r["reembedded"], 5, "{r}");
    assert_eq!(r["changes"][0]["action"], "reembed", "{r}");
    assert!(
        out.contains("5 re-embedded (coded by another vision model)"),
        "{out}"
    );
    let after = state(db).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for (e, (id, meta, caps)) in &after {
        let (old_id, old_meta, old_caps) = &before[e];
        assert_ne!(id, old_id, "{e}: a photo embedded again gets a new id");
        assert_eq!((meta, caps), (old_meta, old_caps), "{e}");
    }
    let caption_count = before.values().map(|(_, _, c)| c.len() as i64).sum();
    assert_eq!(
        provenance(db).await,
        (
            vec![(new.id.clone(), new.vision_id.clone(), 5)],
            vec![(new.id.clone(), caption_count)]
        )
    );

    // Run again: nothing written, nothing embedded, and no warning at start.
    let (ok, out, r) = sync_with(WINDOWED, db, d, "feed1.csv", &csv);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 5, 0, 0, 0], "{r}");
    assert_eq!(r["reembedded"], 0, "{r}");
    assert!(!out.contains("another bundle"), "{out}");
    assert_eq!(state(db).await, after);
}

/// SQLite, then Postgres (a failure's output names the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalogue_is_reembedded_under_another_vision_model_on_both_engines() {
    let dir = tempfile::tempdir().expect("tempdir");
    reembed_life(&format!("sqlite://{}", dir.path().join("js.db").display())).await;
    let pg = PgCluster::start();
    reembed_life(&pg.create_db("reembed").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_kept_in_sync_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    feed_life(&format!("sqlite://{}", dir.path().join("js.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_kept_in_sync_on_postgres() {
    let pg = PgCluster::start();
    feed_life(&pg.create_db("sync").await).await;
}

/// A feed whose items list several photos, into a collection grouped by product: each photo an image of its
/// product (`<id>~<n>` past the first) with the key and attributes, the words with the first photo only, the
/// text model run once per product's sentence; a rerun changes nothing; a photo dropped from the list is deleted.
/// Refused without a product key, with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn products_with_several_photos_sync_as_one_image_per_photo() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let db = format!("sqlite://{}", d.join("js.db").display());
    std::fs::create_dir(d.join("photos")).expect("mkdir");
    for i in 0..4 {
        std::fs::write(d.join(format!("photos/p{i}.png")), fixture_image(i)).expect("photo");
    }
    std::fs::write(
        d.join("feed1.csv"),
        "id,title,image,price\nsku-1,Red shoe,photos/p0.png|photos/p1.png|photos/p2.png,40\nsku-2,Blue bag,photos/p3.png,20\n",
    )
    .expect("feed");
    std::fs::write(
        d.join("feed2.csv"),
        "id,title,image,price\nsku-1,Red shoe,photos/p0.png|photos/p1.png,40\nsku-2,Blue bag,photos/p3.png,20\n",
    )
    .expect("feed");
    let flags = ["--number-fields", "price", "--text-fields", "title"];

    // Without a product key, several photos are refused before anything is written.
    let (ok, out, _) = sync(&db, d, "feed1.csv", &[&flags[..], &["--create"]].concat());
    assert!(!ok && out.contains("--group-by"), "{out}");
    assert!(state(&db).await.is_empty());

    let create = [&flags[..], &["--create", "--group-by", "product_id"]].concat();
    let (ok, out, r) = sync(&db, d, "feed1.csv", &create);
    assert!(ok, "{out}");
    assert_eq!(r["items"], 2, "{r}");
    assert_eq!(counts(&r), [4, 0, 0, 0, 0, 0, 4], "{r}");
    // The two titles, once each: not once per photo.
    assert_eq!(r["sentences_embedded"], 2, "{r}");
    let s = state(&db).await;
    let ids: Vec<&str> = s.keys().map(String::as_str).collect();
    assert_eq!(ids, vec!["sku-1", "sku-1~2", "sku-1~3", "sku-2"]);
    assert_eq!(
        s["sku-1"].1,
        json!({"title": "Red shoe", "price": 40, "product_id": "sku-1"})
    );
    assert_eq!(s["sku-1~3"].1, json!({"price": 40, "product_id": "sku-1"}));
    assert_eq!(s["sku-2"].1["product_id"], "sku-2");

    // Served: each product once, with its photos.
    let app = common::TestApp::start_url(BUNDLE, &db, &[]).await;
    let (st, found) = app
        .post_json(
            "/v1/collections/shop/images/search",
            json!({"text": "a red shoe", "k": 10}),
        )
        .await;
    assert_eq!(st, 200, "{found}");
    let results = found["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{found}");
    let shoe = results
        .iter()
        .find(|h| h["product"]["key"] == "sku-1")
        .expect("sku-1");
    assert_eq!(
        shoe["product"]["photos"].as_array().expect("photos").len(),
        3
    );
    app.stop().await;

    // A rerun writes nothing; a photo dropped from the list is deleted.
    let (ok, out, r) = sync(&db, d, "feed1.csv", &flags);
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 4, 0, 0, 0], "{r}");
    let (ok, out, r) = sync(
        &db,
        d,
        "feed2.csv",
        &[&flags[..], &["--max-delete-share", "0.3"]].concat(),
    );
    assert!(ok, "{out}");
    assert_eq!(counts(&r), [0, 0, 0, 3, 1, 0, 0], "{r}");
    assert!(!state(&db).await.contains_key("sku-1~3"));
}
