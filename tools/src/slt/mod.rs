//! sqllogictest runner for setfusion.
//!
//! `.slt` files run against a `SessionContext` in one of three [`Mode`]s, with
//! value normalisation and error texts identical to DataFusion's own
//! sqllogictest engine (ported in [`normalize`] and [`engine`]), so DataFusion's
//! test files validate unchanged:
//!
//! * [`run_file`] runs a file and fails with the list of failing records;
//! * [`compare_with_plain`] runs a file record by record in a plain DataFusion
//!   session and in a setfusion session side by side, and reports the records
//!   that pass in plain DataFusion but fail under setfusion (peer suites);
//! * [`run_cli`] is the body of a `setfusion slt FILE...` subcommand.
//!
//! Paths `'test_files/scratch/...'` in SQL (DataFusion's scratch directory) are
//! redirected to a per-run temporary directory, and that directory is printed
//! back as `WORKSPACE_ROOT/datafusion/sqllogictest` in results, as DataFusion's
//! runner does for its checkout. A file inside a copy of DataFusion's tree
//! (`<root>/datafusion/sqllogictest/test_files/...`, as the vendored peer
//! suites are) reads its data as DataFusion's runner does from
//! `datafusion/sqllogictest`: `'../core/tests/data/...'`, `'data/...'`,
//! `'test_files/...'` and `'../../testing/...'` resolve under `<root>`, which
//! results print as `WORKSPACE_ROOT`.
//!
//! Labels for `onlyif` / `skipif`: every mode has `Datafusion`; the setfusion
//! modes also have `setfusion` and `setfusion-cpu` or `setfusion-gpu`; the plain
//! mode has `plain`.

pub mod engine;
pub mod normalize;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use sqllogictest::{MakeConnection, Record, RecordOutput, Runner};

pub use engine::{SltEngine, SltError};
pub use normalize::DFColumnType;

/// Which session a file runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `setfusion::context()` with `SET setfusion.strategy = 'cpu'`: every
    /// set operation and semi/anti join runs on setfusion's CPU backend.
    Cpu,
    /// `setfusion::context()` with `setfusion.min_rows = 0` (strategy auto):
    /// even tiny inputs go to the GPU.
    Gpu,
    /// A plain `SessionContext` with DataFusion's defaults (no setfusion).
    Plain,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Cpu => "cpu",
            Mode::Gpu => "gpu",
            Mode::Plain => "plain",
        }
    }

    fn labels(&self) -> &'static [&'static str] {
        match self {
            Mode::Cpu => &["Datafusion", "setfusion", "setfusion-cpu"],
            Mode::Gpu => &["Datafusion", "setfusion", "setfusion-gpu"],
            Mode::Plain => &["Datafusion", "plain"],
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Mode::Cpu),
            "gpu" => Ok(Mode::Gpu),
            "plain" | "datafusion" => Ok(Mode::Plain),
            other => Err(format!("unknown slt mode '{other}': expected cpu, gpu or plain")),
        }
    }
}

/// Whether [`Mode::Gpu`] can run here: `Err(reason)` when no GPU is usable.
pub fn gpu_mode_status() -> std::result::Result<(), String> {
    setfusion::gpu::available(0).map_err(|e| e.to_string())
}

/// The session of a mode. Target partitions are fixed at 4, as in
/// DataFusion's sqllogictest runner, so plans do not depend on the machine.
pub async fn session(mode: Mode) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(4);
    let ctx = match mode {
        Mode::Plain => SessionContext::new_with_state(
            SessionStateBuilder::new().with_config(config).with_default_features().build(),
        ),
        Mode::Cpu => {
            let ctx = setfusion::context_with_config(config);
            ctx.sql("SET setfusion.strategy = 'cpu'").await?.collect().await?;
            ctx
        }
        Mode::Gpu => {
            let ctx = setfusion::context_with_config(config);
            ctx.sql("SET setfusion.min_rows = 0").await?.collect().await?;
            ctx
        }
    };
    Ok(ctx)
}

/// A temporary directory standing in for DataFusion's `test_files/scratch`,
/// removed on drop.
struct Scratch {
    root: PathBuf,
    /// The root of the DataFusion tree the file lies in, if it does.
    workspace: Option<PathBuf>,
}

/// `<root>` when `file` is `<root>/datafusion/sqllogictest/test_files/...`.
fn datafusion_workspace(file: &Path) -> Option<PathBuf> {
    let file = std::fs::canonicalize(file).ok()?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d.ends_with("datafusion/sqllogictest/test_files") {
            return d.parent()?.parent()?.parent().map(Path::to_path_buf);
        }
        dir = d.parent();
    }
    None
}

/// The position of `file` among DataFusion's test files (`test_files/` stripped:
/// `joins.slt`, `string/string.slt`), or its file name outside such a tree.
pub fn test_file_key(file: &Path) -> String {
    let s = file.to_string_lossy();
    match s.rfind("sqllogictest/test_files/") {
        Some(at) => s[at + "sqllogictest/test_files/".len()..].to_string(),
        None => file_name(&s),
    }
}

impl Scratch {
    fn new(file: &Path) -> Result<Self> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "setfusion-slt-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        std::fs::create_dir_all(root.join("test_files").join("scratch").join(stem))?;
        Ok(Self { root, workspace: datafusion_workspace(file) })
    }

    fn sql_replacements(&self) -> Vec<(String, String)> {
        let root = self.root.to_string_lossy();
        let mut r = vec![
            ("'test_files/scratch/".to_string(), format!("'{root}/test_files/scratch/")),
            ("'./test_files/scratch/".to_string(), format!("'{root}/test_files/scratch/")),
        ];
        if let Some(ws) = &self.workspace {
            // Relative to datafusion/sqllogictest, where DataFusion's runner works; the
            // scratch paths above are replaced first (they no longer start with `'test_files/`).
            let ws = ws.to_string_lossy();
            for (from, to) in [
                ("'../../", ""),
                ("'../", "datafusion/"),
                ("'test_files/", "datafusion/sqllogictest/test_files/"),
                ("'./test_files/", "datafusion/sqllogictest/test_files/"),
                ("'data/", "datafusion/sqllogictest/data/"),
            ] {
                r.push((from.to_string(), format!("'{ws}/{to}")));
            }
        }
        r
    }

    fn path_replacements(&self) -> Vec<(String, String)> {
        let root = self.root.to_string_lossy().into_owned();
        let to = "WORKSPACE_ROOT/datafusion/sqllogictest".to_string();
        let mut r = vec![(root.clone(), to.clone())];
        // object_store paths are printed without the leading '/'.
        if let Some(rel) = root.strip_prefix('/') {
            r.push((rel.to_string(), to));
        }
        if let Some(ws) = &self.workspace {
            let ws = ws.to_string_lossy().into_owned();
            if let Some(rel) = ws.strip_prefix('/') {
                r.push((format!("{rel}/"), "WORKSPACE_ROOT/".to_string()));
            }
            r.insert(0, (format!("{ws}/"), "WORKSPACE_ROOT/".to_string()));
        }
        r
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn runner_for(
    ctx: SessionContext,
    mode: Mode,
    scratch: &Scratch,
) -> Runner<SltEngine, impl MakeConnection<Conn = SltEngine>> {
    let sql_r = scratch.sql_replacements();
    let path_r = scratch.path_replacements();
    let mut runner = Runner::new(move || {
        let engine = SltEngine::new(ctx.clone(), "DataFusion")
            .with_sql_replacements(sql_r.clone())
            .with_path_replacements(path_r.clone());
        async move { Ok::<_, SltError>(engine) }
    });
    for label in mode.labels() {
        runner.add_label(label);
    }
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner.with_normalizer(normalize::value_normalizer);
    runner.with_validator(normalize::df_value_validator);
    runner
}

fn parse(path: &Path) -> Result<Vec<Record<DFColumnType>>> {
    sqllogictest::parse_file(path).map_err(|e| DataFusionError::External(Box::new(e)))
}

/// The SQL text of a statement or query record.
fn sql_of(record: &Record<DFColumnType>) -> Option<&str> {
    match record {
        Record::Statement { sql, .. } | Record::Query { sql, .. } => Some(sql),
        _ => None,
    }
}

/// `file:line` of a statement or query record.
fn location_of(record: &Record<DFColumnType>) -> Option<(String, u32)> {
    match record {
        Record::Statement { loc, .. } | Record::Query { loc, .. } => Some((loc.file().to_string(), loc.line())),
        _ => None,
    }
}

fn file_name(path: &str) -> String {
    Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.to_string())
}

/// Run one `.slt` file in `mode`. The error lists every failing record as
/// `file:line: what failed`.
pub async fn run_file(path: &Path, mode: Mode) -> Result<()> {
    run_file_counted(path, mode).await.map(|_| ())
}

/// Like [`run_file`], returning the number of statement and query records run.
pub async fn run_file_counted(path: &Path, mode: Mode) -> Result<usize> {
    let records = parse(path)?;
    let scratch = Scratch::new(path)?;
    let mut runner = runner_for(session(mode).await?, mode, &scratch);
    let mut errs = vec![];
    let mut ran = 0;
    for record in records {
        if let Record::Halt { .. } = record {
            break;
        }
        let counted = sql_of(&record).is_some();
        match runner.run_async(record).await {
            Ok(RecordOutput::Nothing) => {}
            Ok(_) => ran += counted as usize,
            Err(e) => {
                ran += counted as usize;
                errs.push(format!("{}: {}", e.location(), e.kind()));
            }
        }
    }
    runner.shutdown_async().await;
    if errs.is_empty() {
        Ok(ran)
    } else {
        let mut msg = format!("{} of {} records failed in {} ({} mode)\n", errs.len(), ran, path.display(), mode);
        for (i, e) in errs.iter().enumerate() {
            msg.push_str(&format!("\n{}. {}\n", i + 1, e));
        }
        Err(DataFusionError::Execution(msg))
    }
}

/// Run `paths` in each of `modes`, printing one line per file and mode
/// (failures followed by their records). Gpu mode is skipped with a message
/// when no GPU is usable, unless `SETFUSION_REQUIRE_GPU=1`. Returns the exit
/// code: 0 when everything passed, 1 otherwise.
pub async fn run_cli(paths: &[PathBuf], modes: &[Mode]) -> i32 {
    let require_gpu = crate::env::require_gpu();
    let gpu = gpu_mode_status();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for mode in modes {
        for path in paths {
            if *mode == Mode::Gpu {
                if let Err(reason) = &gpu {
                    if require_gpu {
                        println!("FAIL {} [gpu]: no usable GPU: {reason}", path.display());
                        failed += 1;
                    } else {
                        println!("skip {} [gpu]: {reason}", path.display());
                        skipped += 1;
                    }
                    continue;
                }
            }
            let start = std::time::Instant::now();
            match run_file_counted(path, *mode).await {
                Ok(n) => {
                    println!("ok   {} [{}]: {} records in {:.2?}", path.display(), mode, n, start.elapsed());
                    passed += 1;
                }
                Err(e) => {
                    println!("FAIL {} [{}]: {}", path.display(), mode, e.strip_backtrace());
                    failed += 1;
                }
            }
        }
    }
    println!("slt: {passed} passed, {failed} failed, {skipped} skipped");
    i32::from(failed > 0)
}

/// One record of a peer comparison.
#[derive(Debug, Clone)]
pub struct PeerDiff {
    /// File name (no directory) of the record.
    pub file: String,
    pub line: u32,
    pub sql: String,
    /// Why the record failed (the engine that failed it).
    pub error: String,
}

impl PeerDiff {
    /// `file:line`, the key used in `EXPECTED_DIFFERENCES.txt`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

impl fmt::Display for PeerDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key(), self.error)
    }
}

/// Result of [`compare_with_plain`].
#[derive(Debug, Clone)]
pub struct PeerReport {
    pub path: PathBuf,
    pub mode: Mode,
    /// Statement/query records that passed in both sessions.
    pub passed: usize,
    /// Records that failed in plain DataFusion (not compared).
    pub skipped_in_plain: usize,
    /// Records skipped by `onlyif` / `skipif` conditions.
    pub skipped_by_condition: usize,
    /// Records that pass in plain DataFusion but fail under setfusion.
    pub differences: Vec<PeerDiff>,
    /// Records that fail in plain DataFusion but pass under setfusion
    /// (informational; usually a missing data file that setfusion's plan
    /// never reads, or an expected error that both raise differently).
    pub setfusion_only: Vec<PeerDiff>,
}

impl PeerReport {
    /// Number of records that pass in plain DataFusion but fail under setfusion.
    pub fn failed(&self) -> usize {
        self.differences.len()
    }

    /// The differences whose `file:line` is not in `allowed`.
    pub fn unexpected<'a>(&'a self, allowed: &'a HashSet<String>) -> impl Iterator<Item = &'a PeerDiff> + 'a {
        self.differences.iter().filter(move |d| !allowed.contains(&d.key()))
    }

    /// One summary line.
    pub fn summary(&self) -> String {
        format!(
            "{} [{}]: {} passed in both, {} fail only under setfusion, {} failed in plain (skipped), {} skipped by condition, {} pass only under setfusion",
            self.path.display(),
            self.mode,
            self.passed,
            self.differences.len(),
            self.skipped_in_plain,
            self.skipped_by_condition,
            self.setfusion_only.len()
        )
    }
}

/// Run the file record by record in a plain DataFusion session and in a
/// setfusion session of `mode`. Each session processes the whole file in
/// order (so statements create tables in both); records that fail in plain
/// DataFusion are not compared.
pub async fn compare_with_plain(path: &Path, mode: Mode) -> Result<PeerReport> {
    let records = parse(path)?;
    let plain_scratch = Scratch::new(path)?;
    let sf_scratch = Scratch::new(path)?;
    let mut plain = runner_for(session(Mode::Plain).await?, Mode::Plain, &plain_scratch);
    let mut sf = runner_for(session(mode).await?, mode, &sf_scratch);
    let mut report = PeerReport {
        path: path.to_path_buf(),
        mode,
        passed: 0,
        skipped_in_plain: 0,
        skipped_by_condition: 0,
        differences: vec![],
        setfusion_only: vec![],
    };
    for record in records {
        if let Record::Halt { .. } = record {
            break;
        }
        let sql = sql_of(&record).map(str::to_string);
        let loc = location_of(&record);
        let p = plain.run_async(record.clone()).await;
        let mut s = sf.run_async(record.clone()).await;
        // DataFusion's spill tests give a few hundred KB to partitions that
        // race for it; who loses depends on the scheduler, in plain DataFusion
        // as much as under setfusion. A record that passed in plain and lost
        // that race here is run again, at most twice, before it counts.
        for _ in 0..2 {
            let lost_pool_race = matches!(&s, Err(e) if e.kind().to_string().contains("Resources exhausted"));
            if !(lost_pool_race && matches!(p, Ok(RecordOutput::Query { .. }))) {
                break;
            }
            s = sf.run_async(record.clone()).await;
        }
        let (Some(sql), Some((file, line))) = (sql, loc) else { continue };
        let diff = |error: String| PeerDiff { file: test_file_key(Path::new(&file)), line, sql: sql.clone(), error };
        match (p, s) {
            (Ok(RecordOutput::Nothing), _) => report.skipped_by_condition += 1,
            (Ok(_), Ok(_)) => report.passed += 1,
            (Ok(_), Err(e)) => report.differences.push(diff(e.kind().to_string())),
            (Err(_), Ok(RecordOutput::Nothing)) => report.skipped_by_condition += 1,
            (Err(pe), Ok(_)) => {
                report.skipped_in_plain += 1;
                report.setfusion_only.push(diff(format!("plain DataFusion: {}", pe.kind())));
            }
            (Err(_), Err(_)) => report.skipped_in_plain += 1,
        }
    }
    plain.shutdown_async().await;
    sf.shutdown_async().await;
    Ok(report)
}

/// Parse an `EXPECTED_DIFFERENCES.txt`: one `file:line  reason` per line,
/// `#` comments and blank lines ignored. Returns key -> reason.
pub fn read_expected_differences(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, reason) = match line.split_once(char::is_whitespace) {
            Some((k, r)) => (k.trim(), r.trim()),
            None => (line, ""),
        };
        if !key.contains(':') {
            return Err(DataFusionError::Plan(format!(
                "{}:{}: expected 'file:line  reason', got '{line}'",
                path.display(),
                i + 1
            )));
        }
        out.insert(key.to_string(), reason.to_string());
    }
    Ok(out)
}
