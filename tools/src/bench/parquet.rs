//! `setfusion bench parquet [--runs N] [--codecs snappy,zstd,lz4_raw,gzip] [--no-fresh]`:
//! issue 27's four queries (and three with filters the device runs: two columns, a BOOLEAN, a range the
//! page index prunes) over two BIGINT tables of N rows (100M, or
//! `SETFUSION_BENCH_ROWS`) written as Parquet (1M-row groups; snappy, and
//! zstd) under `SETFUSION_PARQUET_DIR` (else `~/.cache/setfusion/parquet`):
//! DataFusion and setfusion in fresh processes and warm (medians), DuckDB
//! where python3 can `import duckdb` (warm, in one process), and the device
//! scan's decoded GB/s on table a's keys. `SETFUSION_BENCH_ONLY=a,b` runs
//! only the queries whose names contain one of these.
//!
//! Table a: k = (i * 2654435761) % 400M, p = i, f = i % 3 != 0; table b: k = (i * 40503 + 7) % 400M
//! (the keys of `bench setops`), i = 1..=N.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::median;
use crate::datagen;

/// The queries, by name (issue 27's table).
pub const QUERIES: &[(&str, &str)] = &[
    ("IN", "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b)"),
    ("INTERSECT", "SELECT count(*) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)"),
    ("INTERSECT ALL", "SELECT count(*) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)"),
    ("NOT IN, sum(p)", "SELECT sum(p) FROM a WHERE k NOT IN (SELECT k FROM b)"),
    // A filter over two columns of the probe side (about half its rows pass): run on the device.
    ("IN, filtered", "SELECT count(*) FROM a WHERE k < 4 * p AND k IN (SELECT k FROM b)"),
    // A BOOLEAN column as the probe side's filter (two thirds of its rows pass).
    ("IN, boolean filter", "SELECT count(*) FROM a WHERE f AND k IN (SELECT k FROM b)"),
    // A range of p, which rises with the row: row groups pruned by their statistics, pages by the page index.
    ("IN, p range", "SELECT count(*) FROM a WHERE p BETWEEN 40000000 AND 42500000 AND k IN (SELECT k FROM b)"),
    // NOT IN under OR: a mark join (DataFusion's two-valued answer is wrong where the subquery holds a NULL);
    // both sides are read by the device, the probe side's rows coming back with their marks.
    ("NOT IN under OR", "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b) OR p < 1000000"),
];

const ROW_GROUP: usize = 1 << 20;
const CHILD_LIMIT: Duration = Duration::from_secs(300);

fn exec_err(m: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(format!("bench parquet: {m}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn table_dir(n: u64, codec: &str, table: &str) -> PathBuf {
    crate::env::parquet_bench_dir().join(format!("{n}")).join(codec).join(table)
}

/// Write table `name` (a: k, p, f; b: k) of `n` rows as Parquet files, once.
fn write_table(n: u64, codec: &str, name: &str) -> Result<PathBuf> {
    let dir = table_dir(n, codec, name);
    // (`done`: the tables before `f` was added, written again.)
    if dir.join("done-f").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let payload = name == "a";
    let key: fn(u64) -> i64 = if payload { datagen::key_a } else { datagen::key_b };
    let mut fields = vec![Field::new("k", DataType::Int64, false)];
    if payload {
        fields.push(Field::new("p", DataType::Int64, false));
        fields.push(Field::new("f", DataType::Boolean, false));
    }
    let schema = Arc::new(Schema::new(fields));
    let files = (n as usize).div_ceil(ROW_GROUP * 4).clamp(1, 16);
    let per = n.div_ceil(files as u64);
    let compression = match codec {
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        // Inflated on host threads before the device decodes their pages (issue 27 asks whether the device should).
        "lz4_raw" => Compression::LZ4_RAW,
        "gzip" => Compression::GZIP(Default::default()),
        _ => Compression::SNAPPY,
    };
    let t = Instant::now();
    let written: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..files as u64)
            .map(|f| {
                let (schema, dir) = (schema.clone(), dir.clone());
                s.spawn(move || -> Result<()> {
                    let props = WriterProperties::builder()
                        .set_compression(compression)
                        .set_max_row_group_row_count(Some(ROW_GROUP))
                        .build();
                    let file = std::fs::File::create(dir.join(format!("part-{f:02}.parquet")))?;
                    let mut w = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
                    let (start, end) = (f * per + 1, ((f + 1) * per).min(n) + 1);
                    let mut i = start;
                    while i < end {
                        let j = (i + 65536).min(end);
                        let mut cols: Vec<Arc<dyn datafusion::arrow::array::Array>> =
                            vec![Arc::new(Int64Array::from_iter_values((i..j).map(key)))];
                        if payload {
                            cols.push(Arc::new(Int64Array::from_iter_values((i..j).map(|x| x as i64))));
                            cols.push(Arc::new(BooleanArray::from_iter((i..j).map(|x| Some(x % 3 != 0)))));
                        }
                        w.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
                        i = j;
                    }
                    w.close()?;
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(exec_err("writer thread panicked")))).collect()
    });
    written.into_iter().collect::<Result<Vec<()>>>()?;
    std::fs::write(dir.join("done-f"), b"")?;
    eprintln!("wrote {name} ({n} rows, {codec}, {files} files) in {:.1} s", t.elapsed().as_secs_f64());
    Ok(dir)
}

async fn session(n: u64, codec: &str, setfusion: bool) -> Result<SessionContext> {
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let config = SessionConfig::new().with_target_partitions(threads);
    let ctx = if setfusion { setfusion::context_with_config(config) } else { SessionContext::new_with_config(config) };
    for t in ["a", "b"] {
        let dir = table_dir(n, codec, t);
        ctx.register_parquet(t, dir.to_str().ok_or_else(|| exec_err("path"))?, ParquetReadOptions::default()).await?;
    }
    Ok(ctx)
}

async fn time_query(ctx: &SessionContext, sql: &str) -> Result<(Duration, String)> {
    let t = Instant::now();
    let batches = ctx.sql(sql).await?.collect().await?;
    let elapsed = t.elapsed();
    let answer = super::tpch::canonical_rows(&batches)?.join(" ");
    Ok((elapsed, answer))
}

struct Args {
    runs: usize,
    codecs: Vec<String>,
    fresh: bool,
    one: Option<(String, bool, String)>,
}

/// `setfusion bench parquet`' options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Timed runs per cell (the median) [default: SETFUSION_BENCH_RUNS, else 5]
    #[arg(long, value_name = "N")]
    pub runs: Option<usize>,
    /// The files' compressions, one table of results each
    #[arg(long, value_name = "CODEC,..", value_delimiter = ',', value_parser = ["snappy", "zstd", "lz4_raw", "gzip"], default_values = ["snappy", "zstd"])]
    pub codecs: Vec<String>,
    /// Leave out the fresh-process columns
    #[arg(long)]
    pub no_fresh: bool,
    /// The fresh-process run of this one query (the parent starts these)
    #[arg(long, value_name = "QUERY", hide = true)]
    pub one: Option<String>,
    /// --one's engine: setfusion, else plain DataFusion
    #[arg(long, hide = true, default_value = "setfusion")]
    pub engine: String,
    /// --one's codec
    #[arg(long, hide = true, default_value = "snappy")]
    pub codec: String,
}

fn settings(o: Options) -> Args {
    Args {
        runs: o.runs.or_else(crate::env::bench_runs).unwrap_or(5).max(1),
        codecs: o.codecs,
        fresh: !o.no_fresh,
        one: o.one.map(|q| (q, o.engine == "setfusion", o.codec)),
    }
}

/// DuckDB's warm medians (ms) of the queries, or why there are none.
fn duckdb_times(n: u64, codec: &str, runs: usize) -> std::result::Result<Vec<f64>, String> {
    let script = r#"
import sys, time, statistics
import duckdb
a, b, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
con.execute(f"CREATE VIEW a AS SELECT * FROM read_parquet('{a}/*.parquet')")
con.execute(f"CREATE VIEW b AS SELECT * FROM read_parquet('{b}/*.parquet')")
for sql in sys.stdin.read().split("\n"):
    if not sql.strip():
        continue
    times = []
    for r in range(runs + 1):
        t = time.perf_counter()
        con.execute(sql).fetchall()
        times.append((time.perf_counter() - t) * 1e3)
    print("ms=%.3f" % statistics.median(times[1:]), flush=True)
"#;
    let (a, b) = (table_dir(n, codec, "a"), table_dir(n, codec, "b"));
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, &a.to_string_lossy(), &b.to_string_lossy(), &runs.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3: {e}"))?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().ok_or("python3 stdin")?;
        for (_, sql) in QUERIES {
            writeln!(stdin, "{sql}").map_err(|e| e.to_string())?;
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    // (A line may carry other output before its time: DuckDB's progress bar ends in a carriage return.)
    let times: Vec<f64> =
        text.lines().filter_map(|l| l.rsplit_once("ms=")).filter_map(|(_, v)| v.trim().parse().ok()).collect();
    if times.len() != QUERIES.len() {
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err.lines().last().unwrap_or("no output").to_string();
        return Err(if why.contains("No module named 'duckdb'") {
            "DuckDB's Python package is not installed (python3: No module named 'duckdb')".into()
        } else {
            why
        });
    }
    Ok(times)
}

/// The device scan alone on table a's keys: (end to end incl. file reads, upload + decode) GB/s of decoded keys.
fn device_scan_rate(dir: &Path, runs: usize) -> std::result::Result<(f64, f64, String), String> {
    let g = setfusion::gpu::gpu(0).map_err(|e| e.to_string())?;
    let mut files: Vec<setfusion::scan::ScanFile> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .map(|path| setfusion::scan::ScanFile { path, ranges: vec![] })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let (mut total, mut device) = (Vec::new(), Vec::new());
    let (mut detail, mut rows) = (String::new(), 0u64);
    // One untimed run first (kernels, page cache). A lease per run, as an
    // operator holds the device (the kept read buffers are page-locked after it).
    for run in 0..=runs.max(1) {
        let _lease = g.lease(0);
        let mut stats = setfusion::gpu::TransferStats::default();
        let t = Instant::now();
        let (decoded, r) = match setfusion::scan::scan_to_device(
            &g,
            &files,
            "k",
            &DataType::Int64,
            &Default::default(),
            0,
            None,
            &mut stats,
        )
        .map_err(|e| e.to_string())?
        {
            Ok(x) => x,
            Err(why) => return Err(format!("falls back: {why}")),
        };
        drop(decoded);
        if run == 0 {
            continue;
        }
        total.push(t.elapsed());
        device.push(r.upload + r.decode);
        rows = r.rows;
        detail = format!(
            "{} rows, {} pages, {:.0} MB of pages: read {:.1} ms, upload {:.1} ms, decode {:.1} ms",
            r.rows,
            r.pages,
            r.bytes_read as f64 / 1e6,
            ms(r.read),
            ms(r.upload),
            ms(r.decode)
        );
    }
    let gbs = |d: Duration| rows as f64 * 8.0 / d.as_secs_f64() / 1e9;
    Ok((gbs(median(total)), gbs(median(device)), detail))
}

/// Run the benchmark; see the module documentation.
pub async fn run(options: Options) -> Result<()> {
    let a = settings(options);
    let n: u64 = crate::env::bench_rows().unwrap_or(100_000_000);
    if let Some((name, setfusion, codec)) = &a.one {
        let sql = QUERIES.iter().find(|(q, _)| q == name).ok_or_else(|| exec_err(format!("no query {name}")))?.1;
        let ctx = session(n, codec, *setfusion).await?;
        let (t, answer) = time_query(&ctx, sql).await?;
        println!("ms={:.3} rows={}", ms(t), answer.len());
        return Ok(());
    }
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let device = match setfusion::gpu::gpu(0) {
        Ok(g) => format!("{} ({} SMs)", g.info().name, g.info().multiprocessors),
        Err(e) => format!("no GPU ({e})"),
    };
    let mut report = String::new();
    writeln!(report, "## {n} x {n} BIGINT keys from Parquet (1M-row groups): {device}, {threads} host threads\n")
        .unwrap();
    writeln!(report, "Median of {} runs. Fresh = the query in a new process; warm = again in one process, the device column cache off (`cache_limit = 0`: the files are read every time); cached = again in one process with the cache on (the default); DuckDB warm, in one process.\n", a.runs).unwrap();
    for codec in &a.codecs {
        write_table(n, codec, "a")?;
        write_table(n, codec, "b")?;
        let plain = session(n, codec, false).await?;
        // Warm without the device column cache (every run reads the files), and warm with it.
        let sf = session(n, codec, true).await?;
        sf.sql("SET setfusion.cache_limit = 0").await?.collect().await?;
        let cached = session(n, codec, true).await?;
        let duck = duckdb_times(n, codec, a.runs);
        writeln!(report, "### {codec}\n").unwrap();
        match &duck {
            Ok(_) => {}
            Err(why) => writeln!(report, "DuckDB: not measured ({why}).\n").unwrap(),
        }
        writeln!(report, "| query | answer | DuckDB ms | DataFusion fresh / warm ms | setfusion fresh / warm / cached ms | vs DataFusion fresh / warm / cached | vs DuckDB fresh / warm | setfusion's device scan (warm, no cache) |").unwrap();
        writeln!(report, "|---|---|---|---|---|---|---|---|").unwrap();
        let only = crate::env::bench_only();
        for (qi, (name, sql)) in QUERIES.iter().enumerate() {
            if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
                continue;
            }
            let (_, df_answer) = time_query(&plain, sql).await?;
            let (_, sf_answer) = time_query(&sf, sql).await?;
            let (_, cached_answer) = time_query(&cached, sql).await?;
            // Warm means the device is up (as `bench tpch`'s warm runs).
            setfusion::gpu::wait_started(0);
            let (mut df, mut sw, mut sc) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..a.runs {
                df.push(time_query(&plain, sql).await?.0);
                sw.push(time_query(&sf, sql).await?.0);
                let (t, answer) = time_query(&cached, sql).await?;
                if answer != cached_answer {
                    return Err(exec_err(format!("{name}: a cached run answered {answer}, the first {cached_answer}")));
                }
                sc.push(t);
            }
            let (df_warm, sf_warm, sf_cached) = (median(df), median(sw), median(sc));
            let fresh = |setfusion: bool| -> Result<Duration> {
                if !a.fresh {
                    return Ok(Duration::ZERO);
                }
                let args: Vec<String> = [
                    "bench",
                    "parquet",
                    "--one",
                    name,
                    "--engine",
                    if setfusion { "setfusion" } else { "datafusion" },
                    "--codec",
                    codec,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                super::fresh_runs(&args, name, a.runs, CHILD_LIMIT).map(|(t, _, _)| t)
            };
            let (df_fresh, sf_fresh) = (fresh(false)?, fresh(true)?);
            let analyzed = sf.sql(&format!("EXPLAIN ANALYZE {sql}")).await?.collect().await?;
            let text = super::tpch::canonical_rows(&analyzed)?.join("\n");
            let scan = text
                .lines()
                .find_map(|l| {
                    l.split("device scan ")
                        .nth(1)
                        .map(|s| s.split(", elapsed").next().unwrap_or(s).trim_end_matches(['"', ',', ']']).to_string())
                })
                .or_else(|| {
                    text.lines().find_map(|l| {
                        l.split("device_scan=\"")
                            .nth(1)
                            .map(|s| format!("not used: {}", s.split('"').next().unwrap_or(s)))
                    })
                })
                .unwrap_or_else(|| "not used".into());
            let duck_ms = duck.as_ref().ok().map(|t| t[qi]);
            let ratio = |x: Duration, y: Duration| {
                if y.is_zero() {
                    "-".to_string()
                } else {
                    format!("{:.2}x", x.as_secs_f64() / y.as_secs_f64())
                }
            };
            let vs_duck = |s: Duration| match duck_ms {
                Some(d) if !s.is_zero() => format!("{:.2}x", d / ms(s)),
                _ => "-".into(),
            };
            let answer = if df_answer == sf_answer && sf_answer == cached_answer {
                sf_answer.clone()
            } else {
                format!("{sf_answer} (DataFusion: {df_answer}, cached: {cached_answer})")
            };
            let line = format!(
                "| {name} | {answer} | {} | {:.1} / {:.1} | {:.1} / {:.1} / {:.1} | {} / {} / {} | {} / {} | {scan} |",
                duck_ms.map_or("-".into(), |d| format!("{d:.1}")),
                ms(df_fresh),
                ms(df_warm),
                ms(sf_fresh),
                ms(sf_warm),
                ms(sf_cached),
                ratio(df_fresh, sf_fresh),
                ratio(df_warm, sf_warm),
                ratio(df_warm, sf_cached),
                vs_duck(sf_fresh),
                vs_duck(sf_warm),
            );
            eprintln!("{codec} {line}");
            writeln!(report, "{line}").unwrap();
        }
        match device_scan_rate(&table_dir(n, codec, "a"), a.runs) {
            Ok((total, device, detail)) => writeln!(
                report,
                "\nDevice scan of a.k alone ({codec}): {total:.1} GB/s of decoded keys end to end (file reads from the page cache, upload, decode), {device:.1} GB/s upload + decode; last run: {detail}.\n"
            )
            .unwrap(),
            Err(why) => writeln!(report, "\nDevice scan of a.k alone ({codec}): {why}.\n").unwrap(),
        }
    }
    println!("{report}");
    Ok(())
}
