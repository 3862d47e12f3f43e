//! The crate's single integration-test binary (`cargo test --release --test all`).
//!
//! Keep it one binary (each test binary links all of DataFusion). To add tests,
//! create `tests/all/<name>.rs` and add a line below:
//!
//! ```text
//! #[path = "all/<name>.rs"]
//! mod <name>;
//! ```
//!
//! Shared helpers (GPU skip logic, runtime, crate root) are in `tests/all/common.rs`
//! and reachable as `crate::common::...`.

#[cfg(feature = "ballista")]
#[path = "all/ballista.rs"]
mod ballista;
#[path = "all/cli.rs"]
mod cli;
#[cfg(feature = "ballista")]
#[path = "all/cluster_processes.rs"]
mod cluster_processes;
#[path = "all/common.rs"]
mod common;
#[path = "all/concurrency.rs"]
mod concurrency;
#[path = "all/device_scan.rs"]
mod device_scan;
#[path = "all/device_scan_tpch.rs"]
mod device_scan_tpch;
#[path = "all/devices.rs"]
mod devices;
#[path = "all/differential.rs"]
mod differential;
#[path = "all/memory.rs"]
mod memory;
#[path = "all/plan_citizenship.rs"]
mod plan_citizenship;
#[path = "all/slt_suites.rs"]
mod slt_suites;
#[path = "all/ssjoin.rs"]
mod ssjoin;
#[path = "all/tools_units.rs"]
mod tools_units;
#[path = "all/tpch.rs"]
mod tpch;
