//! sqllogictest suites:
//!
//! * every `sql-tests/*.slt` in cpu mode and in gpu mode (gpu mode is skipped
//!   with `skipping gpu mode: <reason>` when no GPU is usable, unless
//!   `SETFUSION_REQUIRE_GPU=1`);
//! * the peer suites `sql-tests/peer/*.slt` (DataFusion's own test files):
//!   every record that passes in plain DataFusion must also pass under
//!   setfusion, except those listed in `sql-tests/peer/EXPECTED_DIFFERENCES.txt`.
//!
//! `SETFUSION_SLT=name` restricts both to files whose name contains `name`.

use std::collections::HashSet;
use std::path::PathBuf;

use setfusion::slt::{self, Mode};

use crate::common::{block_on, crate_root, gpu_or_skip};

fn slt_files(dir: PathBuf) -> Vec<PathBuf> {
    let filter = setfusion::env::slt_filter().unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(filter.as_str()))
        .collect();
    files.sort();
    files
}

fn run_sql_tests(mode: Mode) {
    let files = slt_files(crate_root().join("sql-tests"));
    assert!(!files.is_empty() || setfusion::env::slt_filter().is_some(), "no sql-tests/*.slt files");
    let failures = block_on(move || async move {
        let mut failures = vec![];
        for f in &files {
            let start = std::time::Instant::now();
            match slt::run_file_counted(f, mode).await {
                Ok(n) => println!("ok   {} [{mode}]: {n} records in {:.2?}", f.display(), start.elapsed()),
                Err(e) => {
                    println!("FAIL {} [{mode}]", f.display());
                    failures.push(e.strip_backtrace());
                }
            }
        }
        failures
    });
    assert!(failures.is_empty(), "{} file(s) failed in {mode} mode:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn sql_tests_cpu() {
    let _device = crate::common::shared_device();
    run_sql_tests(Mode::Cpu);
}

#[test]
fn sql_tests_gpu() {
    let _device = crate::common::shared_device();
    if gpu_or_skip().is_err() {
        return;
    }
    run_sql_tests(Mode::Gpu);
}

fn run_peer_suites(mode: Mode) {
    let dir = crate_root().join("sql-tests").join("peer");
    let expected = slt::read_expected_differences(&dir.join("EXPECTED_DIFFERENCES.txt")).expect("EXPECTED_DIFFERENCES.txt");
    let allowed: HashSet<String> = expected.keys().cloned().collect();
    let files = slt_files(dir);
    let reports = block_on(move || async move {
        let mut reports = vec![];
        for f in &files {
            let start = std::time::Instant::now();
            let report = slt::compare_with_plain(f, mode).await.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            println!("{} in {:.2?}", report.summary(), start.elapsed());
            reports.push(report);
        }
        reports
    });

    let mut unexpected = vec![];
    let mut seen = HashSet::new();
    for r in &reports {
        for d in &r.differences {
            seen.insert(d.key());
        }
        unexpected.extend(r.unexpected(&allowed).map(|d| d.to_string()));
        for d in &r.setfusion_only {
            println!("note: passes only under setfusion: {}", d.key());
        }
    }
    let (passed, failed, skipped): (usize, usize, usize) = reports
        .iter()
        .fold((0, 0, 0), |(p, f, s), r| (p + r.passed, f + r.failed(), s + r.skipped_in_plain));
    println!("peer suites [{mode}]: {passed} passed in both, {failed} differ ({} unexpected), {skipped} failed in plain", unexpected.len());
    // Only warn on stale entries: a file filter or a mode may not reach them.
    for key in allowed.difference(&seen) {
        println!("note: EXPECTED_DIFFERENCES entry {key} did not differ in {mode} mode");
    }
    assert!(
        unexpected.is_empty(),
        "{} record(s) pass in plain DataFusion but fail under setfusion ({mode} mode) and are not in sql-tests/peer/EXPECTED_DIFFERENCES.txt:\n\n{}",
        unexpected.len(),
        unexpected.join("\n\n")
    );
}

#[test]
fn peer_suites_cpu() {
    let _device = crate::common::shared_device();
    run_peer_suites(Mode::Cpu);
}

#[test]
fn peer_suites_gpu() {
    let _device = crate::common::shared_device();
    if gpu_or_skip().is_err() {
        return;
    }
    run_peer_suites(Mode::Gpu);
}
