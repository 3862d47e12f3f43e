//! Benchmark programs. Each is run by `cargo bench --bench <name>` (thin
//! wrappers in `benches/`) and by `setfusion bench <name>`, so the release
//! CLI alone can benchmark on a machine without a Rust toolchain.
pub mod families;
pub mod filter;
pub mod lists;
pub mod setops;
pub mod ssjoin;
pub mod tpch;

/// The median of some timings (the upper one of an even count).
pub(crate) fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}
