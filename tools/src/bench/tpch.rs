//! TPC-H over Parquet, as users run it (issue 13): the data generated
//! in-process with `tpchgen-arrow` (no download) and cached as Parquet, the 22
//! queries (`sql-tests/tpch/qN.sql`) and set-operation queries over the TPC-H
//! tables ([`SET_QUERIES`]), each timed three ways: DataFusion's own plan,
//! setfusion in a fresh process, setfusion warm.
//!
//! ```text
//! setfusion bench tpch [--sf 10] [--runs 5] [--queries q4,q16,...] [--out report.md] [--svg chart.svg]
//! ```
//! The data lands in `$SETFUSION_TPCH_DIR` (default `~/.cache/setfusion/tpch`),
//! one folder per scale factor with one folder of Parquet files per table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, RecordBatch, RecordBatchReader};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};

use super::median;

/// The eight TPC-H tables.
pub const TABLES: [&str; 8] = ["nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem"];

macro_rules! tpch_query {
    ($n:literal) => {
        (concat!("q", $n), include_str!(concat!("../../../sql-tests/tpch/q", $n, ".sql")))
    };
}

/// The 22 TPC-H queries (DataFusion's sqllogictest texts), by name `q1`..`q22`.
pub const QUERIES: [(&str, &str); 22] = [
    tpch_query!("1"),
    tpch_query!("2"),
    tpch_query!("3"),
    tpch_query!("4"),
    tpch_query!("5"),
    tpch_query!("6"),
    tpch_query!("7"),
    tpch_query!("8"),
    tpch_query!("9"),
    tpch_query!("10"),
    tpch_query!("11"),
    tpch_query!("12"),
    tpch_query!("13"),
    tpch_query!("14"),
    tpch_query!("15"),
    tpch_query!("16"),
    tpch_query!("17"),
    tpch_query!("18"),
    tpch_query!("19"),
    tpch_query!("20"),
    tpch_query!("21"),
    tpch_query!("22"),
];

/// A set operation over TPC-H tables: `left OP right`. Its exact answer is
/// computed from the two sides alone ([`expected_set_op`]), since DataFusion
/// gets the ALL forms wrong.
#[derive(Debug, Clone, Copy)]
pub struct SetQuery {
    pub name: &'static str,
    pub left: &'static str,
    /// `INTERSECT`, `EXCEPT`, `INTERSECT ALL` or `EXCEPT ALL`.
    pub op: &'static str,
    pub right: &'static str,
}

impl SetQuery {
    pub fn sql(&self) -> String {
        format!("{} {} {}", self.left, self.op, self.right)
    }
}

/// Set operations over TPC-H tables: integer, date, composite and string keys, distinct and ALL.
pub const SET_QUERIES: [SetQuery; 7] = [
    SetQuery {
        name: "intersect_customers",
        left: "SELECT o_custkey FROM orders WHERE o_orderdate < DATE '1995-01-01'",
        op: "INTERSECT",
        right: "SELECT o_custkey FROM orders WHERE o_orderdate >= DATE '1995-01-01'",
    },
    SetQuery {
        name: "except_parts",
        left: "SELECT p_partkey FROM part",
        op: "EXCEPT",
        right: "SELECT l_partkey FROM lineitem WHERE l_shipdate < DATE '1992-04-01'",
    },
    SetQuery {
        name: "except_all_orderkeys",
        left: "SELECT l_orderkey FROM lineitem",
        op: "EXCEPT ALL",
        right: "SELECT o_orderkey FROM orders WHERE o_orderstatus = 'F'",
    },
    SetQuery {
        name: "intersect_all_part_supp",
        left: "SELECT l_partkey, l_suppkey FROM lineitem WHERE l_shipdate >= DATE '1997-01-01'",
        op: "INTERSECT ALL",
        right: "SELECT ps_partkey, ps_suppkey FROM partsupp WHERE ps_availqty > 5000",
    },
    SetQuery {
        name: "except_all_dates_modes",
        left: "SELECT l_shipdate, l_shipmode FROM lineitem WHERE l_quantity < 10",
        op: "EXCEPT ALL",
        right: "SELECT l_commitdate, l_shipmode FROM lineitem WHERE l_quantity > 40",
    },
    SetQuery {
        name: "intersect_all_clerks",
        left: "SELECT o_clerk FROM orders WHERE o_orderpriority = '1-URGENT'",
        op: "INTERSECT ALL",
        right: "SELECT o_clerk FROM orders WHERE o_orderstatus = 'F'",
    },
    SetQuery {
        name: "intersect_order_comments",
        left: "SELECT o_comment FROM orders WHERE o_orderdate < DATE '1995-01-01'",
        op: "INTERSECT",
        right: "SELECT o_comment FROM orders WHERE o_orderdate >= DATE '1995-01-01'",
    },
];

/// Semi / anti joins over TPC-H tables outside the 22 queries (DataFusion answers them correctly).
pub const JOIN_QUERIES: [(&str, &str); 3] = [
    (
        "not_in_lineitem",
        "SELECT o_orderkey, o_totalprice FROM orders WHERE o_orderkey NOT IN \
         (SELECT l_orderkey FROM lineitem WHERE l_returnflag = 'R' AND l_quantity > 20)",
    ),
    (
        "string_in",
        "SELECT o_orderkey FROM orders WHERE o_clerk IN (SELECT o_clerk FROM orders WHERE o_totalprice > 500000)",
    ),
    // One customer's line items: the subquery's few order keys, published as the
    // join's dynamic filter (an IN list), prune lineitem's Parquet row groups and
    // pages (lineitem is written in order key order).
    (
        "customer_lineitems",
        "SELECT count(*), sum(l_extendedprice) FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_custkey = 1000)",
    ),
];

/// Every query of the benchmark by name: the TPC-H queries, [`SET_QUERIES`] and [`JOIN_QUERIES`].
pub fn all_queries() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = QUERIES.iter().map(|(n, s)| (n.to_string(), s.to_string())).collect();
    v.extend(SET_QUERIES.iter().map(|q| (q.name.to_string(), q.sql())));
    v.extend(JOIN_QUERIES.iter().map(|(n, s)| (n.to_string(), s.to_string())));
    v
}

/// The queries `setfusion bench tpch` runs by default.
pub const BENCH_DEFAULT: &[&str] = &[
    "q4",
    "q16",
    "q18",
    "q20",
    "q21",
    "q22",
    "intersect_customers",
    "except_parts",
    "except_all_orderkeys",
    "intersect_all_part_supp",
    "except_all_dates_modes",
    "intersect_all_clerks",
    "intersect_order_comments",
    "not_in_lineitem",
    "string_in",
];

fn exec_err(what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(what.to_string())
}

/// A reader of one part (1-based, of `parts`) of a table.
fn reader(table: &str, sf: f64, part: i32, parts: i32) -> Box<dyn RecordBatchReader + Send> {
    use tpchgen::generators as g;
    use tpchgen_arrow as a;
    const BATCH: usize = 65_536;
    match table {
        "nation" => Box::new(a::NationArrow::new(g::NationGenerator::new(sf, part, parts)).with_batch_size(BATCH)),
        "region" => Box::new(a::RegionArrow::new(g::RegionGenerator::new(sf, part, parts)).with_batch_size(BATCH)),
        "part" => Box::new(a::PartArrow::new(g::PartGenerator::new(sf, part, parts)).with_batch_size(BATCH)),
        "supplier" => {
            Box::new(a::SupplierArrow::new(g::SupplierGenerator::new(sf, part, parts)).with_batch_size(BATCH))
        }
        "partsupp" => {
            Box::new(a::PartSuppArrow::new(g::PartSuppGenerator::new(sf, part, parts)).with_batch_size(BATCH))
        }
        "customer" => {
            Box::new(a::CustomerArrow::new(g::CustomerGenerator::new(sf, part, parts)).with_batch_size(BATCH))
        }
        "orders" => Box::new(a::OrderArrow::new(g::OrderGenerator::new(sf, part, parts)).with_batch_size(BATCH)),
        _ => Box::new(a::LineItemArrow::new(g::LineItemGenerator::new(sf, part, parts)).with_batch_size(BATCH)),
    }
}

/// How many files a table is written as: about one per 2M rows of lineitem's
/// size class, at least one, so scans have several files to split among threads.
fn parts_of(table: &str, sf: f64) -> i32 {
    let weight = match table {
        "lineitem" => 6.0,
        "orders" => 1.5,
        "partsupp" => 0.8,
        "part" | "customer" => 0.2,
        _ => 0.0,
    };
    ((sf * weight / 2.0).ceil() as i32).clamp(1, 64)
}

/// Generate every table at scale factor `sf` as Parquet under `dir` (one
/// folder per table), on all host threads. Written into a temporary folder
/// and renamed, so a cut-short run leaves no half data set.
pub fn generate(sf: f64, dir: &Path) -> Result<()> {
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut work = Vec::new();
    for table in TABLES {
        std::fs::create_dir_all(tmp.join(table))?;
        let parts = parts_of(table, sf);
        work.extend((1..=parts).map(|p| (table, p, parts)));
    }
    // Largest first, so the long lineitem parts start at once.
    work.sort_by_key(|(t, _, _)| std::cmp::Reverse(parts_of(t, sf) * if *t == "lineitem" { 4 } else { 1 }));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get()).min(work.len());
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(table, part, parts)) = work.get(i) else { return Ok(()) };
                        let mut r = reader(table, sf, part, parts);
                        let file = std::fs::File::create(tmp.join(table).join(format!("part-{part:03}.parquet")))?;
                        let mut w = ArrowWriter::try_new(file, r.schema(), Some(props.clone()))?;
                        for batch in r.by_ref() {
                            w.write(&batch?)?;
                        }
                        w.close()?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(exec_err("TPC-H generator thread panicked"))))
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(&tmp, dir)?;
    Ok(())
}

/// The cached data set for scale factor `sf`, generated on first use.
pub fn data_dir(sf: f64) -> Result<PathBuf> {
    let base = crate::env::tpch_dir();
    let dir = base.join(format!("sf{sf}"));
    if !TABLES.iter().all(|t| dir.join(t).is_dir()) {
        let t = Instant::now();
        eprintln!("generating TPC-H SF{sf} as Parquet in {} ...", dir.display());
        generate(sf, &dir)?;
        eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());
    }
    Ok(dir)
}

/// Register the eight tables of `dir` in `ctx`.
pub async fn register(ctx: &SessionContext, dir: &Path) -> Result<()> {
    for t in TABLES {
        ctx.register_parquet(t, dir.join(t).to_string_lossy().as_ref(), ParquetReadOptions::default()).await?;
    }
    Ok(())
}

/// The rows of a result as strings (columns joined by `|`), sorted, for
/// comparing answers as multisets. Floats are rounded to 9 significant digits:
/// different plans sum in different orders.
pub fn canonical_rows(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let mut rows = Vec::new();
    let opts = FormatOptions::default().with_null("NULL");
    for b in batches {
        let cols: Vec<_> =
            b.columns().iter().map(|c| (c.clone(), ArrayFormatter::try_new(c.as_ref(), &opts))).collect();
        for i in 0..b.num_rows() {
            let mut row = String::new();
            for (c, f) in &cols {
                if !row.is_empty() || b.num_columns() == 0 {
                    row.push('|');
                }
                let f = f.as_ref().map_err(|e| exec_err(e))?;
                match c.data_type() {
                    DataType::Float64 | DataType::Float32 if c.is_valid(i) => {
                        let v: f64 = f.value(i).to_string().parse().unwrap_or(f64::NAN);
                        write!(row, "{v:.9e}").unwrap();
                    }
                    _ => write!(row, "{}", f.value(i)).unwrap(),
                }
            }
            rows.push(row);
        }
    }
    rows.sort();
    Ok(rows)
}

/// The exact answer of `left OP right` from the two sides' rows, by SQL's
/// multiset rules (NULLs equal): INTERSECT ALL min(m, n), EXCEPT ALL
/// max(m - n, 0), the distinct forms one copy.
pub fn expected_set_op(op: &str, left: &[String], right: &[String]) -> Vec<String> {
    let mut m: HashMap<&str, (usize, usize)> = HashMap::new();
    for r in left {
        m.entry(r.as_str()).or_default().0 += 1;
    }
    for r in right {
        m.entry(r.as_str()).or_default().1 += 1;
    }
    let mut out = Vec::new();
    for (row, (a, b)) in m {
        let copies = match op {
            "INTERSECT ALL" => a.min(b),
            "EXCEPT ALL" => a.saturating_sub(b),
            "INTERSECT" => usize::from(a > 0 && b > 0),
            _ => usize::from(a > 0 && b == 0),
        };
        out.extend(std::iter::repeat_n(row.to_string(), copies));
    }
    out.sort();
    out
}

/// A session over the data: `setfusion` or plain DataFusion, `partitions` target partitions.
pub async fn session(dir: &Path, setfusion: bool, partitions: usize, settings: &[&str]) -> Result<SessionContext> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let ctx = if setfusion { setfusion::context_with_config(config) } else { SessionContext::new_with_config(config) };
    for s in settings {
        ctx.sql(s).await?.collect().await?;
    }
    register(&ctx, dir).await?;
    Ok(ctx)
}

/// Run one query and return its time and row count.
async fn time_query(ctx: &SessionContext, sql: &str) -> Result<(Duration, usize)> {
    let t = Instant::now();
    let batches = ctx.sql(sql).await?.collect().await?;
    Ok((t.elapsed(), batches.iter().map(|b| b.num_rows()).sum()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Args {
    sf: f64,
    runs: usize,
    queries: Vec<String>,
    out: Option<PathBuf>,
    svg: Option<PathBuf>,
    one: Option<(String, bool)>,
    chart_from: Vec<PathBuf>,
}

/// `setfusion bench tpch`' options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// TPC-H scale factor
    #[arg(long, value_name = "N", default_value_t = 1.0, value_parser = parse_scale_factor)]
    pub sf: f64,
    /// Timed runs per cell (the median); 0 counts as 1
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub runs: usize,
    /// The queries to time: q1..q22 and the set-operation queries [default: the benchmark's list]
    #[arg(long, value_name = "NAME,..", value_delimiter = ',')]
    pub queries: Vec<String>,
    /// Write the markdown table to this file
    #[arg(long, value_name = "FILE.md")]
    pub out: Option<PathBuf>,
    /// Draw the chart into this SVG file
    #[arg(long, value_name = "FILE.svg")]
    pub svg: Option<PathBuf>,
    /// Redraw the chart (--svg) from tables this benchmark wrote, instead of measuring (runs split over several calls)
    #[arg(long, value_name = "FILE.md,..", value_delimiter = ',', requires = "svg")]
    pub chart_from: Vec<PathBuf>,
    /// The fresh-process run of one query (the parent starts these)
    #[arg(long, value_name = "QUERY", hide = true)]
    pub one: Option<String>,
    /// --one's engine: setfusion, else plain DataFusion
    #[arg(long, hide = true, default_value = "setfusion")]
    pub engine: String,
}

/// A scale factor: a positive number.
fn parse_scale_factor(s: &str) -> std::result::Result<f64, String> {
    s.parse::<f64>().ok().filter(|sf| *sf > 0.0 && sf.is_finite()).ok_or_else(|| "expected a positive number".into())
}

fn settings(o: Options) -> Args {
    let queries = if o.queries.is_empty() { BENCH_DEFAULT.iter().map(|s| s.to_string()).collect() } else { o.queries };
    Args {
        sf: o.sf,
        runs: o.runs.max(1),
        queries,
        out: o.out,
        svg: o.svg,
        one: o.one.map(|q| (q, o.engine == "setfusion")),
        chart_from: o.chart_from,
    }
}

/// One query in this (fresh) process: prints `ms=<query time> rows=<n>`.
async fn run_one(dir: &Path, name: &str, setfusion: bool) -> Result<()> {
    let sql = all_queries().into_iter().find(|(n, _)| n == name).ok_or_else(|| exec_err(format!("no query {name}")))?.1;
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let ctx = session(dir, setfusion, threads, &[]).await?;
    let (t, rows) = time_query(&ctx, &sql).await?;
    println!("ms={:.3} rows={rows}", ms(t));
    Ok(())
}

/// The longest a fresh one-query process may run (DataFusion's plan for
/// `except_all_dates_modes` takes ~55 s at SF10).
const CHILD_LIMIT: Duration = Duration::from_secs(300);

/// Time `name` in `runs` fresh processes of this binary; the median query time.
fn fresh_process(name: &str, setfusion: bool, sf: f64, runs: usize) -> Result<(Duration, usize)> {
    let args: Vec<String> = [
        "bench",
        "tpch",
        "--sf",
        &sf.to_string(),
        "--one",
        name,
        "--engine",
        if setfusion { "setfusion" } else { "datafusion" },
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    super::fresh_runs(&args, name, runs, CHILD_LIMIT).map(|(t, rows, _)| (t, rows))
}

/// One measured line of the report.
struct Measured {
    name: String,
    rows: usize,
    df_fresh: Duration,
    sf_fresh: Duration,
    df_warm: Duration,
    sf_warm: Duration,
    /// Warm with the device column cache on (None: a report from before the column).
    sf_cached: Option<Duration>,
    offloaded: String,
}

/// What setfusion put in the plan: its operators with backend, or "not offloaded".
async fn offload_summary(ctx: &SessionContext, sql: &str) -> Result<String> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
    let ops: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            ["SemiJoinExec", "SetOpExec", "SimilarityJoinExec", "MarkJoinExec", "SetfusionDeclinedExec"]
                .iter()
                .any(|op| l.starts_with(op))
        })
        .map(|l| {
            let name = l.split(':').next().unwrap_or(l);
            if name == "SetfusionDeclinedExec" {
                let reason = l.split("reason=\"").nth(1).unwrap_or("?").trim_end_matches('"');
                return if reason.starts_with("cost model") {
                    "declined (cost model)".to_string()
                } else {
                    format!("declined ({reason})")
                };
            }
            let backend = l.split("backend=").nth(1).map(|b| b.split([',', ' ']).next().unwrap_or(b)).unwrap_or("?");
            format!("{name}/{backend}")
        })
        .collect();
    Ok(if ops.is_empty() { "DataFusion's plan".into() } else { ops.join(", ") })
}

/// Run the benchmark; see the module documentation.
pub async fn run(options: Options) -> Result<()> {
    let a = settings(options);
    if !a.chart_from.is_empty() {
        let svg = a.svg.as_ref().ok_or_else(|| exec_err("--chart-from needs --svg"))?;
        let mut measured = Vec::new();
        let mut device = String::new();
        for p in &a.chart_from {
            let text = std::fs::read_to_string(p)?;
            if let Some(d) = text.lines().next().and_then(|l| l.split(": ").nth(1)).and_then(|l| l.split(',').next()) {
                device = d.to_string();
            }
            measured.extend(text.lines().filter_map(parse_row));
        }
        return chart(&measured, a.sf, &device, svg);
    }
    let dir = data_dir(a.sf)?;
    if let Some((name, setfusion)) = &a.one {
        return run_one(&dir, name, *setfusion).await;
    }
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let plain = session(&dir, false, threads, &[]).await?;
    // Warm: the files are read every time (the device column cache off); cached: the cache on (the default).
    let sf = session(&dir, true, threads, &["SET setfusion.cache_limit = 0"]).await?;
    let sf_cache = session(&dir, true, threads, &[]).await?;
    let queries = all_queries();
    let mut measured = Vec::new();
    for name in &a.queries {
        let sql = &queries.iter().find(|(n, _)| n == name).ok_or_else(|| exec_err(format!("no query {name}")))?.1;
        let (df_fresh, _) = fresh_process(name, false, a.sf, a.runs)?;
        let (sf_fresh, rows) = fresh_process(name, true, a.sf, a.runs)?;
        let (mut df, mut sfw, mut sfc) = (Vec::new(), Vec::new(), Vec::new());
        // One untimed run each first (page cache, the device's start, the cache filled).
        time_query(&plain, sql).await?;
        let (_, sf_rows) = time_query(&sf, sql).await?;
        let (_, cached_rows) = time_query(&sf_cache, sql).await?;
        if cached_rows != sf_rows {
            return Err(exec_err(format!("{name}: {cached_rows} rows with the column cache, {sf_rows} without")));
        }
        // Warm means the device is up: the untimed runs above began its start in the background
        // (a plan that used it, or the next planning after one that asked for it),
        // and runs timed while it still starts keep DataFusion's plan (q4 timed so on a loan whose
        // start took ~0.6 s: 206 ms, against 75-79 ms once up).
        setfusion::gpu::wait_started(0);
        for _ in 0..a.runs {
            df.push(time_query(&plain, sql).await?.0);
            sfw.push(time_query(&sf, sql).await?.0);
            sfc.push(time_query(&sf_cache, sql).await?.0);
        }
        let m = Measured {
            name: name.clone(),
            rows: rows.max(sf_rows),
            df_fresh,
            sf_fresh,
            df_warm: median(df),
            sf_warm: median(sfw),
            sf_cached: Some(median(sfc)),
            offloaded: offload_summary(&sf, sql).await?,
        };
        eprintln!(
            "{name}: DataFusion {:.1} / {:.1} ms, setfusion {:.1} / {:.1} / {:.1} ms (fresh / warm / cached); {}",
            ms(m.df_fresh),
            ms(m.df_warm),
            ms(m.sf_fresh),
            ms(m.sf_warm),
            m.sf_cached.map_or(0.0, ms),
            m.offloaded
        );
        measured.push(m);
        // Written after every query, so a run cut short still leaves its table.
        let report = report(&measured, a.sf, a.runs, threads);
        if let Some(p) = &a.out {
            std::fs::write(p, &report)?;
        }
    }
    println!("{}", report(&measured, a.sf, a.runs, threads));
    if let Some(p) = &a.svg {
        chart(&measured, a.sf, &gpu_line(), p)?;
    }
    Ok(())
}

fn gpu_line() -> String {
    match setfusion::gpu::gpu(0) {
        Ok(g) => g.info().name.clone(),
        Err(e) => format!("no GPU ({e})"),
    }
}

/// The markdown table of the measured queries.
fn report(measured: &[Measured], sf: f64, runs: usize, threads: usize) -> String {
    let mut report = String::new();
    writeln!(report, "## TPC-H SF{sf} over Parquet: {}, {threads} host threads\n", gpu_line()).unwrap();
    writeln!(report, "Median of {runs} runs. Fresh = the query's time in a new process (setfusion installed, tables registered; the device starts when a plan uses it); warm = the same query again in one process, the device column cache off (`setfusion.cache_limit = 0`: the files are read every time); cached = again in one process with the cache on (the default).\n").unwrap();
    writeln!(report, "| query | rows | DataFusion fresh ms | setfusion fresh ms | speedup fresh | DataFusion warm ms | setfusion warm ms | speedup warm | setfusion cached ms | speedup cached | setfusion's plan |").unwrap();
    writeln!(report, "|---|---|---|---|---|---|---|---|---|---|---|").unwrap();
    for m in measured {
        let cached = m.sf_cached.unwrap_or(m.sf_warm);
        writeln!(
            report,
            "| {} | {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}x | {} |",
            m.name,
            m.rows,
            ms(m.df_fresh),
            ms(m.sf_fresh),
            m.df_fresh.as_secs_f64() / m.sf_fresh.as_secs_f64(),
            ms(m.df_warm),
            ms(m.sf_warm),
            m.df_warm.as_secs_f64() / m.sf_warm.as_secs_f64(),
            ms(cached),
            m.df_warm.as_secs_f64() / cached.as_secs_f64(),
            m.offloaded
        )
        .unwrap();
    }
    report
}

/// A row of [`report`]'s table back (for `--chart-from`).
fn parse_row(line: &str) -> Option<Measured> {
    let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
    let ms_of = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok()).map(|v| Duration::from_secs_f64(v / 1e3));
    Some(Measured {
        name: cells.first()?.to_string(),
        rows: cells.get(1)?.parse().ok()?,
        df_fresh: ms_of(2)?,
        sf_fresh: ms_of(3)?,
        df_warm: ms_of(5)?,
        sf_warm: ms_of(6)?,
        // Reports before the cached column end with the plan at 8.
        sf_cached: if cells.len() >= 11 { ms_of(8) } else { None },
        offloaded: cells.get(if cells.len() >= 11 { 10 } else { 8 })?.to_string(),
    })
}

/// An SVG chart of the speedups over DataFusion per query: horizontal bars,
/// fresh process and warm, with the 1x line.
fn chart(measured: &[Measured], sf: f64, device: &str, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| exec_err(format!("chart: {e}"));
    let n = measured.len();
    let speed = |m: &Measured| {
        (m.df_fresh.as_secs_f64() / m.sf_fresh.as_secs_f64(), m.df_warm.as_secs_f64() / m.sf_warm.as_secs_f64())
    };
    let top = measured
        .iter()
        .map(|m| {
            let (f, w) = speed(m);
            f.max(w)
        })
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (860, 110 + 36 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut c = ChartBuilder::on(&root)
        .caption(format!("setfusion's speedup over DataFusion, TPC-H SF{sf} over Parquet"), ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(180)
        .build_cartesian_2d(0f64..top, 0f64..n as f64)
        .map_err(|e| err(&e))?;
    // Row i (from the top) is query i; its label sits at the row's middle.
    let names: Vec<String> = measured.iter().map(|m| m.name.clone()).collect();
    let row = |i: usize| (n - 1 - i) as f64;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            let r = y.floor() as usize;
            if (y - r as f64 - 0.5).abs() < 0.01 && r < n {
                names[n - 1 - r].clone()
            } else {
                String::new()
            }
        })
        .x_desc(format!("DataFusion time / setfusion time ({device})"))
        .draw()
        .map_err(|e| err(&e))?;
    let fresh = RGBColor(0x4c, 0x72, 0xb0);
    let warm = RGBColor(0xdd, 0x84, 0x52);
    c.draw_series(
        measured
            .iter()
            .enumerate()
            .map(|(i, m)| Rectangle::new([(0.0, row(i) + 0.52), (speed(m).0, row(i) + 0.9)], fresh.filled())),
    )
    .map_err(|e| err(&e))?
    .label("fresh process")
    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], fresh.filled()));
    c.draw_series(
        measured
            .iter()
            .enumerate()
            .map(|(i, m)| Rectangle::new([(0.0, row(i) + 0.1), (speed(m).1, row(i) + 0.48)], warm.filled())),
    )
    .map_err(|e| err(&e))?
    .label("warm (same process)")
    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], warm.filled()));
    c.draw_series(std::iter::once(PathElement::new(vec![(1.0, 0.0), (1.0, n as f64)], BLACK.stroke_width(1))))
        .map_err(|e| err(&e))?;
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
