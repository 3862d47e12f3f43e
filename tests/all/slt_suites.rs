//! sqllogictest suites:
//!
//! * every `sql-tests/*.slt` in cpu mode and in gpu mode (gpu mode is skipped
//!   with `skipping gpu mode: <reason>` when no GPU is usable, unless
//!   `SETFUSION_REQUIRE_GPU=1`);
//! * the peer suites: every non-Spark `.slt` file of DataFusion's own tests,
//!   vendored under `sql-tests/peer/datafusion/sqllogictest/test_files` (see
//!   sql-tests/peer/NOTICE), compared record by record with plain DataFusion:
//!   every record that passes in plain DataFusion must also pass under
//!   setfusion, except those listed in `sql-tests/peer/EXPECTED_DIFFERENCES.txt`;
//!   files listed in `sql-tests/peer/SKIPPED_FILES.txt` are not run.
//!
//! `SETFUSION_SLT=name` restricts both to files whose name contains `name`.

use std::collections::HashSet;
use std::path::PathBuf;

use setfusion_tools::slt::{self, Mode};

use crate::common::{block_on, crate_root, gpu_or_skip};

fn slt_files(dir: PathBuf) -> Vec<PathBuf> {
    let filter = setfusion_tools::env::slt_filter().unwrap_or_default();
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
    assert!(!files.is_empty() || setfusion_tools::env::slt_filter().is_some(), "no sql-tests/*.slt files");
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

/// The vendored DataFusion test files (see sql-tests/peer/NOTICE).
fn peer_test_files() -> std::path::PathBuf {
    crate_root().join("sql-tests/peer/datafusion/sqllogictest/test_files")
}

/// Every `.slt` file under `dir`, recursively, as (key, path): the key is the
/// path under `dir` (`joins.slt`, `string/string.slt`), as in
/// EXPECTED_DIFFERENCES.txt; files or folders listed in `skipped` are left out.
fn peer_files(dir: &std::path::Path, skipped: &HashSet<String>) -> Vec<(String, PathBuf)> {
    let filter = setfusion_tools::env::slt_filter().unwrap_or_default();
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display())) {
            let path = entry.unwrap().path();
            let key = path.strip_prefix(dir).unwrap().to_string_lossy().replace('\\', "/");
            if skipped.contains(&key) || skipped.contains(&format!("{key}/")) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if key.ends_with(".slt") && key.contains(filter.as_str()) {
                out.push((key, path));
            }
        }
    }
    out.sort();
    out
}

/// Each file is compared on its own (its own sessions and scratch folder), so
/// several run at once: one worker thread per core, at most 4, each with its own runtime.
fn compare_files(files: Vec<(String, PathBuf)>, mode: Mode) -> Vec<slt::PeerReport> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    let queue = std::sync::Mutex::new(files.into_iter().rev().collect::<Vec<_>>());
    let reports = std::sync::Mutex::new(vec![]);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let Some((key, f)) = queue.lock().unwrap().pop() else { break };
                let start = std::time::Instant::now();
                let report = block_on(move || async move { slt::compare_with_plain(&f, mode).await })
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                println!("{} in {:.2?}", report.summary(), start.elapsed());
                reports.lock().unwrap().push(report);
            });
        }
    });
    let mut reports = reports.into_inner().unwrap();
    reports.sort_by(|a, b| a.path.cmp(&b.path));
    reports
}

fn run_peer_suites(mode: Mode) {
    let started = std::time::Instant::now();
    let dir = crate_root().join("sql-tests").join("peer");
    let expected =
        slt::read_expected_differences(&dir.join("EXPECTED_DIFFERENCES.txt")).expect("EXPECTED_DIFFERENCES.txt");
    let allowed: HashSet<String> = expected.keys().cloned().collect();
    // `path  reason` per line (a folder ends with '/'), '#' comments.
    let skipped: HashSet<String> = std::fs::read_to_string(dir.join("SKIPPED_FILES.txt"))
        .expect("SKIPPED_FILES.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let files = peer_files(&peer_test_files(), &skipped);
    assert!(
        !files.is_empty() || setfusion_tools::env::slt_filter().is_some(),
        "no peer .slt files under {}",
        peer_test_files().display()
    );
    let n_files = files.len();
    let reports = compare_files(files, mode);

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
    let sum = |f: fn(&slt::PeerReport) -> usize| reports.iter().map(f).sum::<usize>();
    let (passed, failed) = (sum(|r| r.passed), sum(|r| r.failed()));
    let (in_plain, by_condition) = (sum(|r| r.skipped_in_plain), sum(|r| r.skipped_by_condition));
    println!(
        "peer suites [{mode}]: {n_files} files, {} records: {} pass in plain DataFusion, {passed} of them under setfusion, {failed} differ ({} expected, {} unexpected); {in_plain} fail in plain (not compared), {by_condition} skipped by condition; {:.1?}",
        passed + failed + in_plain + by_condition,
        passed + failed,
        failed - unexpected.len(),
        unexpected.len(),
        started.elapsed()
    );
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
