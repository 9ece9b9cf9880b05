//! The benchmark harness behind docs/benchmarks.md: `cargo bench --bench bench -- <what> [--flag value]...`
//! (what: projection, hubness, index, graph, ingest, seed, load; `scripts/bench.sh` runs them all). Each prints one JSON
//! object. tests/bench_smoke.rs runs the same code on tiny inputs so CI notices when a bench breaks.
mod suite;

fn main() -> anyhow::Result<()> {
    // `cargo bench` appends `--bench`; it means nothing here.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let report = suite::run(&args)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
