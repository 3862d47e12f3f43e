//! Randomized differential test: `setfusion fuzz` in small (the generator and
//! the reference evaluator live in `src/fuzz.rs`, shared with the CLI's long run).

use crate::common::{block_on, gpu_or_skip};

/// `setfusion fuzz` in small: random tables (up to 50,000 rows) and random
/// set operations, semi / anti joins and subquery predicates in every boolean
/// context, on the CPU backend and every GPU strategy where a GPU is usable,
/// against the fuzz's reference evaluator. `SETFUSION_FUZZ_QUERIES` sets the
/// number (default 600); `setfusion fuzz --queries 10000` is the long run.
#[test]
fn fuzz_small_run_agrees() {
    let _device = crate::common::shared_device();
    let queries: usize = std::env::var("SETFUSION_FUZZ_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let opts = setfusion::fuzz::FuzzOptions { queries, seed: 20261124, max_rows: 50_000, gpu };
        match setfusion::fuzz::run(&opts).await {
            Ok(r) => println!("fuzz: {} queries in {} rounds agree on {}", r.queries, r.rounds, r.backends.join(", ")),
            Err(e) => panic!("{e}"),
        }
    });
}
