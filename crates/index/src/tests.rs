//! The index's unit tests: graph and exact search, deletes and rebuilds, concurrency, snapshots, offsets.

use std::sync::atomic::Ordering;

use super::{
    graph::{CONTEXTS, Slots},
    *,
};

fn vectors(n: usize, dim: usize, seed: u64) -> Vec<(i64, Vec<f32>)> {
    let mut s = seed;
    (1..=n as i64)
        .map(|id| {
            let mut v: Vec<f32> = (0..dim)
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
                })
                .collect();
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= n);
            (id, v)
        })
        .collect()
}

/// An index of `data` built on the graph (`graph_params`).
fn graph_index(data: &[(i64, Vec<f32>)]) -> VectorIndex {
    graph_index_with(data, |_| ())
}

/// `graph_index` with `tweak` applied to its parameters.
fn graph_index_with(data: &[(i64, Vec<f32>)], tweak: impl FnOnce(&mut IndexParams)) -> VectorIndex {
    let mut params = graph_params();
    tweak(&mut params);
    VectorIndex::build(params, data.to_vec()).expect("build")
}

fn graph_params() -> IndexParams {
    IndexParams {
        exact_below: 0,
        build_threads: 1,
        ..IndexParams::default()
    }
}

#[test]
fn finds_itself_hides_deleted_and_rebuilds() {
    let data = vectors(600, 32, 7);
    let idx = graph_index(&data);
    for (id, v) in data.iter().step_by(37) {
        let hits = idx.search(v, Score::Cosine, 0, 3, None);
        assert_eq!(hits[0].id, *id);
        assert!(hits[0].score > 0.999);
    }
    // Delete a third: gone from every search at once, and a rebuild drops their holes.
    let mut due = false;
    for (id, _) in data.iter().filter(|(id, _)| id % 3 == 0) {
        due |= idx.remove(*id);
    }
    assert!(due, "a rebuild is due past the threshold");
    for (id, v) in data.iter().filter(|(id, _)| id % 3 == 0).step_by(11) {
        let hits = idx.search(v, Score::Cosine, 0, 10, None);
        assert!(hits.iter().all(|h| h.id % 3 != 0), "deleted {id} came back");
    }
    idx.insert(10_000, data[0].1.clone(), 0.0).expect("insert");
    assert_eq!(idx.deleted(), 200);
    idx.rebuild().expect("rebuild");
    assert_eq!(idx.deleted(), 0);
    assert_eq!(idx.len(), 401);
    let hits = idx.search(&data[0].1, Score::Cosine, 0, 2, None);
    let got: HashSet<i64> = hits.iter().map(|h| h.id).collect();
    assert_eq!(
        got,
        HashSet::from([1, 10_000]),
        "the point added after the build is found"
    );
    let hits = idx.search(&data[1].1, Score::Cosine, 0, 1, None);
    assert_eq!(hits[0].id, 2);
    // Filters and paging.
    let allowed: HashSet<i64> = [5, 7, 11].into_iter().collect();
    let hits = idx.search(&data[6].1, Score::Cosine, 0, 10, Some(&allowed));
    assert_eq!(hits.len(), 3);
    assert_eq!(hits[0].id, 7);
    let all = idx.search(&data[1].1, Score::Cosine, 0, 6, None);
    let page = idx.search(&data[1].1, Score::Cosine, 3, 3, None);
    assert_eq!(&all[3..], &page[..]);
}

#[test]
fn grows_past_its_first_capacity_one_insert_at_a_time() {
    let idx = graph_index(&[]);
    let data = vectors(2_500, 16, 11);
    for (id, v) in &data {
        idx.insert(*id, v.clone(), 0.0).expect("insert");
    }
    assert_eq!(idx.len(), 2_500);
    for (id, v) in data.iter().step_by(97) {
        let hits = idx.search(v, Score::Cosine, 0, 1, None);
        assert_eq!(hits[0].id, *id);
    }
}

#[test]
fn concurrent_searches_get_what_a_lone_search_gets() {
    // On the graph itself (the index would hide a failed graph search behind its exact fallback): twice
    // as many threads as scratch contexts, started at once, each get what a lone search gets.
    let data = vectors(3_000, 16, 5);
    let idx = graph_index_with(&data, |p| p.build_threads = 0);
    let graph = idx.read().graph.clone().expect("a graph");
    let queries: Vec<Vec<f32>> = data.iter().step_by(13).map(|(_, v)| v.clone()).collect();
    let alone: Vec<Vec<i64>> = queries
        .iter()
        .map(|q| graph.search(q, 5, None).expect("search"))
        .collect();
    let (queries, alone) = (Arc::new(queries), Arc::new(alone));
    let start = Arc::new(std::sync::Barrier::new(CONTEXTS * 2));
    let threads: Vec<_> = (0..CONTEXTS * 2)
        .map(|t| {
            let (graph, queries, alone, start) =
                (graph.clone(), queries.clone(), alone.clone(), start.clone());
            std::thread::spawn(move || -> Result<(), String> {
                start.wait();
                for i in 0..queries.len() {
                    let i = (i + t) % queries.len();
                    let got = graph
                        .search(&queries[i], 5, None)
                        .map_err(|e| e.to_string())?;
                    if got != alone[i] {
                        return Err(format!("query {i}: {got:?}, alone {:?}", alone[i]));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .expect("search thread")
            .expect("every search succeeds");
    }
}

#[test]
fn slots_admit_at_most_one_caller_per_graph_context() {
    let slots = Arc::new(Slots::new());
    let (inside, most) = (
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    );
    let threads: Vec<_> = (0..CONTEXTS * 3)
        .map(|_| {
            let (slots, inside, most) = (slots.clone(), inside.clone(), most.clone());
            std::thread::spawn(move || {
                slots.hold(|| {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
        })
        .collect();
    for t in threads {
        t.join().expect("holder");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= CONTEXTS, "{most} callers inside at once");
    assert!(most > 1, "callers ran one at a time");
}

#[test]
fn snapshot_roundtrip_and_staleness() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = vectors(300, 16, 3);
    let idx = graph_index(&data);
    idx.remove(5);
    idx.save(dir.path(), "t", 42, "b@1").expect("save");
    let live: Vec<_> = data.iter().filter(|(id, _)| *id != 5).cloned().collect();
    let loaded = VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone())
        .unwrap_or_else(|(why, _)| panic!("loads: {why}"));
    assert_eq!(loaded.len(), 299);
    let hits = loaded.search(&data[4].1, Score::Cosine, 0, 5, None);
    assert!(hits.iter().all(|h| h.id != 5));
    let hits = loaded.search(&data[9].1, Score::Cosine, 0, 1, None);
    assert_eq!(hits[0].id, 10);
    // Another generation with the same points (a write that changed no vector): loaded as it is.
    let again = VectorIndex::load(graph_params(), dir.path(), "t", 43, "b@1", live.clone())
        .unwrap_or_else(|(why, _)| panic!("other generation: {why}"));
    assert_eq!((again.len(), again.deleted()), (299, 0));
    assert!(
        VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@2", live.clone()).is_err(),
        "other bundle"
    );
    // Saving replaces the last snapshot, clears the hnsw_rs dumps of earlier versions (which were never
    // overwritten), and leaves other indexes' files alone.
    for f in [
        "t.hnsw.data",
        "t.hnsw.graph",
        "t-123.hnsw.data",
        "t-123.hnsw.graph",
        "t1.hnsw.data",
    ] {
        std::fs::write(dir.path().join(f), b"old dump").expect("write");
    }
    idx.save(dir.path(), "t", 42, "b@1").expect("save again");
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    files.sort();
    assert_eq!(files, ["t.json", "t.usearch", "t1.hnsw.data"]);
    assert!(VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone()).is_ok());
    // A format-1 manifest (hnsw_rs) is stale, not an error.
    std::fs::write(
        dir.path().join("t.json"),
        br#"{"format":1,"generation":42,"bundle_id":"b@1","points":299,"hidden":[5],"basename":"t"}"#,
    )
    .expect("write");
    let (why, back) = VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", live.clone())
        .err()
        .expect("an old snapshot is not loaded");
    assert!(why.contains("stale"), "{why}");
    assert_eq!(back.len(), 299, "the vectors come back for the build");
    idx.save(dir.path(), "t", 42, "b@1").expect("save");
    // Id 1 deleted and 9,999 added since: brought up to the database.
    let mut swapped = live;
    swapped[0].0 = 9_999;
    let caught_up = VectorIndex::load(graph_params(), dir.path(), "t", 42, "b@1", swapped)
        .unwrap_or_else(|(why, _)| panic!("other ids: {why}"));
    assert_eq!(
        caught_up.search(&data[0].1, Score::Cosine, 0, 1, None)[0].id,
        9_999
    );
    assert!(caught_up.vector(1).is_none());
}

#[test]
fn a_snapshot_behind_the_database_is_brought_up_to_it_unless_mostly_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = vectors(400, 16, 11);
    let idx = graph_index(&data[..300]);
    idx.save(dir.path(), "t", 1, "b@1").expect("save");
    // Since the snapshot: ids 1-10 deleted, 301-400 added.
    let now: Vec<_> = data.iter().filter(|(id, _)| *id > 10).cloned().collect();
    let loaded = VectorIndex::load(graph_params(), dir.path(), "t", 2, "b@1", now.clone())
        .unwrap_or_else(|(why, _)| panic!("behind: {why}"));
    assert_eq!((loaded.len(), loaded.deleted()), (390, 10));
    for (id, v) in data.iter().step_by(7) {
        let hits = loaded.search(v, Score::Cosine, 0, 3, None);
        if *id > 10 {
            assert_eq!(hits[0].id, *id, "point {id}");
        } else {
            assert!(
                hits.iter().all(|h| h.id > 10),
                "deleted {id} found: {hits:?}"
            );
        }
    }
    // Most of the snapshot deleted since: a rebuild makes a better graph than one full of holes.
    let few: Vec<_> = data[250..].to_vec();
    let (why, back) = VectorIndex::load(graph_params(), dir.path(), "t", 3, "b@1", few)
        .err()
        .expect("mostly deleted");
    assert!(why.contains("deleted since"), "{why}");
    assert_eq!(back.len(), 150);
}

#[test]
fn caption_queries_on_images_add_each_images_offset_through_the_graph_too() {
    let data = vectors(3_000, 16, 9);
    let q = data[0].1.clone();
    for exact_below in [0, 1_000_000] {
        let idx = graph_index_with(&data, |p| p.exact_below = exact_below);
        let plain = idx.search(&q, Score::CosineOffset, 0, 5, None);
        assert_eq!(plain[0].id, 1, "no offsets yet: the point itself");
        // A large offset lifts a point that the cosine alone ranks far down (it is found among the
        // re-ranked candidates) and sinks the query's own point; Cosine ignores the offsets.
        let far = idx.search(&q, Score::Cosine, 0, 60, None)[50].id;
        idx.set_offsets([(far, 0.5), (1, -0.5), (999_999, 1.0)]);
        let hits = idx.search(&q, Score::CosineOffset, 0, 5, None);
        assert_eq!(hits[0].id, far, "exact_below {exact_below}");
        // Each hit carries its plain similarity beside the score it is ranked by.
        let v_far = &data[(far - 1) as usize].1;
        assert_eq!(hits[0].similarity, Score::Cosine.eval(&q, v_far));
        assert_eq!(hits[0].score, hits[0].similarity + 0.5);
        assert!(hits[1..].iter().all(|h| h.score == h.similarity));
        assert!(
            hits.iter().all(|h| h.id != 1),
            "the sunk point stays out of the top 5"
        );
        assert_eq!(idx.search(&q, Score::Cosine, 0, 1, None)[0].id, 1);
        // A deleted point's offset goes with it; a re-inserted id gets its new one.
        idx.remove(far);
        idx.insert(far, data[(far - 1) as usize].1.clone(), 0.0)
            .expect("insert");
        assert_ne!(idx.search(&q, Score::CosineOffset, 0, 1, None)[0].id, far);
    }
}

#[test]
fn a_broad_filter_on_the_graph_never_gives_a_short_or_wrong_page() {
    let data = vectors(4000, 32, 21);
    let idx = graph_index_with(&data, |p| p.exact_below = 100);
    let q = &data[0].1;
    let exact = |allowed: &HashSet<i64>| -> Vec<i64> {
        let mut all: Vec<(i64, f32)> = data
            .iter()
            .filter(|(id, _)| allowed.contains(id))
            .map(|(id, v)| (*id, Score::Cosine.eval(q, v)))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1));
        all.into_iter().take(10).map(|h| h.0).collect()
    };
    // Half the points, all on the far side of the query: none of the graph's nearest candidates is allowed,
    // so the page must come from the filtered walk or the exact scan, exact and not cut short.
    let far: HashSet<i64> = data
        .iter()
        .filter(|(_, v)| Score::Cosine.eval(q, v) < 0.0)
        .map(|(id, _)| *id)
        .collect();
    assert!(far.len() > 1000, "{}", far.len());
    let got: Vec<i64> = idx
        .search(q, Score::Cosine, 0, 10, Some(&far))
        .into_iter()
        .map(|h| h.id)
        .collect();
    assert_eq!(got, exact(&far));
    // Half the points spread everywhere: the graph's own walk, every hit allowed.
    let spread: HashSet<i64> = data
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| id % 2 == 0)
        .collect();
    let got = idx.search(q, Score::Cosine, 0, 10, Some(&spread));
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|h| spread.contains(&h.id)));
}

#[test]
fn a_filter_narrow_enough_for_the_scan_to_cost_less_is_scanned() {
    use crate::search::{WALK_COST, walk_beats_scan};
    // 1M points, 100 candidates x 8: the scan costs less up to sqrt(3 x 800 x 1M) = 48,990 allowed.
    assert!(
        !walk_beats_scan(WALK_COST, 10_000, 1_000_000, 800),
        "1%: scan"
    );
    assert!(!walk_beats_scan(WALK_COST, 48_900, 1_000_000, 800));
    assert!(walk_beats_scan(WALK_COST, 49_000, 1_000_000, 800));
    assert!(
        walk_beats_scan(WALK_COST, 100_000, 1_000_000, 800),
        "10%: walk"
    );
    assert!(
        walk_beats_scan(WALK_COST, 500_000, 1_000_000, 200),
        "50%: walk"
    );
    // A small collection's narrow filters are scanned.
    assert!(!walk_beats_scan(WALK_COST, 2_000, 5_000, 800));
}

#[test]
fn the_search_breadth_grows_with_the_collection_unless_set() {
    assert_eq!(auto_ef_search(0), 112);
    assert_eq!(auto_ef_search(100_000), 112);
    // Wider past 100k, at pgvector's cap from 1M.
    let at = |n| auto_ef_search(n);
    assert!(at(100_001) >= 112 && at(300_000) > 300 && at(300_000) < 400);
    assert!(at(999_999) > 990, "{}", at(999_999));
    assert_eq!(at(1_000_000), 1000);
    assert_eq!(at(50_000_000), 1000);
    let set = IndexParams {
        ef_search: Some(77),
        ..IndexParams::default()
    };
    assert_eq!(set.ef_search_for(1_000_000), 77);
    // A graph searches with the breadth its parameters give for its size.
    let data: Vec<(i64, std::sync::Arc<[f32]>)> = vectors(50, 8, 3)
        .into_iter()
        .map(|(id, v)| (id, v.into()))
        .collect();
    let g = graph::Graph::build(&set, &data).unwrap().unwrap();
    assert_eq!(g.index.expansion_search(), 77);
    let auto = graph::Graph::build(&IndexParams::default(), &data)
        .unwrap()
        .unwrap();
    assert_eq!(auto.index.expansion_search(), 112);
}
