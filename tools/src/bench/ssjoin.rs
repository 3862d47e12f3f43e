//! Set-similarity join benchmark (issue 4): GPU backend vs CPU backend.
//!
//! ```text
//! cargo bench --bench ssjoin -- [--out FILE] [--quick] [--reps N] [--no-nlj]
//!     [--collections dblp,uniform,zipf] [--sets 100000,1000000]
//!     [--thresholds 0.5,0.6,0.7,0.8,0.9] [--cpu-timeout-s S] [--no-cpu]
//! ```
//! (or `SSJOIN_BENCH_OUT=FILE`). Datasets: DBLP 18k titles as lower-cased
//! 3-gram sets (../shared/data/dblp_t_18k.txt), and generated UNIFORM and
//! ZIPF collections of 100,000 and 1,000,000 sets (set sizes uniform in
//! [10, 50], average 30; UNIFORM: tokens uniform over 100,000; ZIPF: Zipf
//! exponent 1.0 over 100,000 tokens; 1% of the sets are near-duplicates of an
//! earlier set with ~10% of the tokens replaced, so every threshold has
//! answers). Tokens are renumbered by ascending frequency by the
//! preprocessing, timed separately: on the host's cores (the CPU twin, which
//! the CPU backend uses) and on the device (the GPU backend's path; "-" where
//! it declines the collection). Jaccard thresholds 0.5..0.9.
//! The SQL columns time the same self join end to end from SQL (planning,
//! set encoding, preprocessing, join, count) over an in-memory table of the
//! collection, CPU backend (`setfusion.strategy = 'cpu'`) and GPU backend
//! (`setfusion.min_rows = 0`, the cost model's choice below Jaccard 0.95);
//! their counts are checked against the join's pairs. The SQL CPU column is
//! skipped where the CPU join was stopped or not run.
//! Each backend: median of `--reps` runs (default 3; 1 when a run takes
//! more than 10 s); results are checked equal. `--quick`: 100k sets only.
//! `--collections` / `--sets` / `--thresholds` pick what runs (the DBLP
//! collection ignores `--sets`). `--cpu-timeout-s S` stops a CPU-backend run
//! after S seconds and reports it as not finished (the GPU result is then
//! unchecked); `--no-cpu` skips the CPU backend.
//! DataFusion's own nested-loop plan (setfusion disabled) and the SQL
//! similarity join run on the first 4,000 sets of the smallest collection
//! (DBLP; `SSJOIN_BENCH_NLJ_SETS` changes it) at 0.9.
//!
//! `--fresh` times what a user's first query feels instead: the SQL self
//! join over a Parquet file of each collection, in one-query processes, the
//! CPU backend against setfusion's defaults (`dblp5`: each DBLP set five
//! times, 90k sets).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::median;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use setfusion::algo::ssjoin::reference::generate;
use setfusion::algo::ssjoin::{
    default_threads, ssjoin_cpu_until, ssjoin_gpu, JoinStats, Metric, Pair, RawSets, SetCollection, Threshold,
};
use setfusion::algo::ssjoin_prep::{device_input, preprocess, preprocess_gpu};
use setfusion::gpu::TransferStats;

struct Args {
    out: Option<String>,
    reps: usize,
    nlj: bool,
    collections: Vec<String>,
    sets: Vec<usize>,
    thresholds: Vec<f64>,
    cpu_timeout: Option<Duration>,
    cpu: bool,
    fresh: bool,
    one: Option<std::path::PathBuf>,
    engine: String,
}

/// `setfusion bench ssjoin`' options (`cargo bench --bench ssjoin -- ...` takes the same).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Write the markdown table to this file [default: SSJOIN_BENCH_OUT]
    #[arg(long, value_name = "FILE")]
    pub out: Option<String>,
    /// 100k sets only
    #[arg(long, conflicts_with = "sets")]
    pub quick: bool,
    /// Timed runs per backend (the median; 1 when a run takes more than 10 s)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: u64,
    /// Leave out DataFusion's own nested-loop plan and the SQL similarity join on the first sets at 0.9
    #[arg(long)]
    pub no_nlj: bool,
    /// The collections to join (dblp5: each DBLP set five times; the DBLP collections ignore --sets)
    #[arg(long, value_name = "NAME,..", value_delimiter = ',', value_parser = ["dblp", "dblp5", "uniform", "zipf"], ignore_case = true, default_values = ["dblp", "uniform", "zipf"])]
    pub collections: Vec<String>,
    /// Sizes of the generated collections
    #[arg(long, value_name = "N,..", value_delimiter = ',', default_values_t = [100_000, 1_000_000])]
    pub sets: Vec<usize>,
    /// Jaccard thresholds, each in (0, 1]
    #[arg(long, value_name = "T,..", value_delimiter = ',', value_parser = parse_threshold, default_values_t = [0.5, 0.6, 0.7, 0.8, 0.9])]
    pub thresholds: Vec<f64>,
    /// Stop a CPU-backend run after S seconds and report it as not finished (the GPU result is then unchecked)
    #[arg(long = "cpu-timeout-s", value_name = "S", value_parser = parse_seconds)]
    pub cpu_timeout: Option<Duration>,
    /// Skip the CPU backend
    #[arg(long)]
    pub no_cpu: bool,
    /// Instead: the SQL self join from Parquet in fresh processes, the CPU backend against setfusion's default (`auto`; the `setfusion` command only: its children are `setfusion bench ssjoin --one`)
    #[arg(long)]
    pub fresh: bool,
    /// The fresh-process run of one query over this file (the parent starts these)
    #[arg(long, value_name = "FILE.parquet", hide = true)]
    pub one: Option<std::path::PathBuf>,
    /// --one's engine: `cpu` (the CPU backend), `wait` (the GPU backend, waited for), `-whole` after either: the file scanned by DataFusion's file groups (`setfusion.scan_ranges = false`); else setfusion's default
    #[arg(long, hide = true, default_value = "auto")]
    pub engine: String,
}

/// A Jaccard threshold: in (0, 1].
fn parse_threshold(s: &str) -> std::result::Result<f64, String> {
    s.trim().parse::<f64>().ok().filter(|t| *t > 0.0 && *t <= 1.0).ok_or_else(|| "expected a number in (0, 1]".into())
}

/// A positive number of seconds.
fn parse_seconds(s: &str) -> std::result::Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "expected a positive number of seconds".into())
}

fn settings(o: Options) -> Args {
    Args {
        out: o.out.or_else(crate::env::ssjoin_bench_out),
        reps: o.reps as usize,
        nlj: !o.no_nlj,
        collections: o.collections.into_iter().map(|c| c.to_lowercase()).collect(),
        sets: if o.quick { vec![100_000] } else { o.sets },
        thresholds: o.thresholds,
        cpu_timeout: o.cpu_timeout,
        cpu: !o.no_cpu,
        fresh: o.fresh,
        one: o.one,
        engine: o.engine,
    }
}

fn dblp() -> Option<RawSets> {
    let dir = crate::env::data_dir();
    let path = dir.join("dblp_t_18k.txt");
    let text = std::fs::read_to_string(path).ok()?;
    let mut dict: HashMap<String, u64> = HashMap::new();
    let mut raw = RawSets::new();
    for line in text.lines() {
        let title = line.split_once('#').map(|(_, t)| t).unwrap_or(line);
        let keys: Vec<u64> = setfusion::udf::qgram_tokens(&title.to_lowercase(), 3)
            .into_iter()
            .map(|g| {
                let n = dict.len() as u64;
                *dict.entry(g).or_insert(n)
            })
            .collect();
        raw.push(keys);
    }
    Some(raw)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Run `f` up to `reps` times (once if a run takes more than 10 s); None
/// when a run did not finish (`f` returned None).
fn timed(reps: usize, mut f: impl FnMut() -> Option<Vec<Pair>>) -> Option<(Duration, Vec<Pair>)> {
    let mut times = vec![];
    let mut out = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        out = f()?;
        let e = t.elapsed();
        times.push(e);
        if e > Duration::from_secs(10) {
            break;
        }
    }
    Some((median(times), out))
}

fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
    v.sort_unstable();
    v
}

/// The collection as a table `d(id INT, g LIST<UBIGINT>)`, set `i` in row `i`.
fn table(raw: &RawSets) -> RecordBatch {
    use datafusion::arrow::array::{Int32Array, ListBuilder, UInt64Builder};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let mut lb = ListBuilder::new(UInt64Builder::with_capacity(raw.elems.len()));
    for i in 0..raw.len() {
        lb.values().append_slice(raw.set(i));
        lb.append(true);
    }
    let ids = Int32Array::from_iter_values(0..raw.len() as i32);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("g", DataType::List(Arc::new(Field::new("item", DataType::UInt64, true))), true),
    ]));
    RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(lb.finish())]).expect("a valid batch")
}

/// Register `batch` as table `d` of `ctx`, replacing the previous one.
fn register(ctx: &SessionContext, batch: &RecordBatch) -> datafusion::error::Result<()> {
    ctx.deregister_table("d")?;
    let mem = datafusion::datasource::MemTable::try_new(batch.schema(), vec![vec![batch.clone()]])?;
    ctx.register_table("d", Arc::new(mem))?;
    Ok(())
}

/// The Jaccard self join as SQL, counting each pair once.
fn self_join_sql(t: f64) -> String {
    format!("SELECT count(*) FROM d a JOIN d b ON a.id < b.id AND jaccard(a.g, b.g) >= {t}")
}

/// A setfusion session with `settings` applied.
fn session(rt: &tokio::runtime::Runtime, settings: &[&str]) -> datafusion::error::Result<SessionContext> {
    rt.block_on(async {
        let ctx = setfusion::context();
        for s in settings {
            ctx.sql(s).await?.collect().await?;
        }
        Ok(ctx)
    })
}

/// Run `q` (a count) `reps` times from SQL to the last batch (once if a run
/// takes more than 10 s): the median time, the count, and what the
/// similarity join's last run reported (EXPLAIN ANALYZE's `ran`).
fn time_sql(
    rt: &tokio::runtime::Runtime,
    ctx: &SessionContext,
    q: &str,
    reps: usize,
) -> datafusion::error::Result<(Duration, i64, String)> {
    rt.block_on(async {
        let mut times = Vec::new();
        let (mut count, mut ran) = (0, String::new());
        for _ in 0..reps {
            let t = Instant::now();
            let plan = ctx.sql(q).await?.create_physical_plan().await?;
            let batches = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await?;
            let e = t.elapsed();
            times.push(e);
            count = batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .map_or(-1, |c| c.value(0));
            let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
            ran = shown
                .lines()
                .find_map(|l| {
                    l.split_once("SimilarityJoinExec")
                        .and_then(|(_, rest)| rest.split_once(", ran="))
                        .map(|(_, r)| r.to_string())
                })
                .unwrap_or_else(|| "no SimilarityJoinExec in the plan".into());
            if e > Duration::from_secs(10) {
                break;
            }
        }
        Ok((median(times), count, ran))
    })
}

/// The collections `args` asks for, each made when called (1M sets take ~1 GB each).
type Datasets = Vec<(String, Box<dyn Fn() -> Option<RawSets>>)>;

/// The collections `args` asks for, by name, generated lazily.
fn datasets(args: &Args) -> Datasets {
    let want = |c: &str| args.collections.iter().any(|x| x == c);
    let mut datasets: Datasets = vec![];
    for (name, copies) in [("dblp", 1), ("dblp5", 5)] {
        if want(name) {
            let label =
                if copies == 1 { "DBLP-18k 3-grams".to_string() } else { format!("DBLP-18k 3-grams x{copies}") };
            datasets.push((
                label,
                Box::new(move || {
                    let Some(d) = dblp() else {
                        eprintln!("dblp_t_18k.txt not found: skipping DBLP");
                        return None;
                    };
                    let mut raw = RawSets::new();
                    for _ in 0..copies {
                        for i in 0..d.len() {
                            raw.push(d.set(i).to_vec());
                        }
                    }
                    Some(raw)
                }),
            ));
        }
    }
    for &n in &args.sets {
        let label = if n % 1000 == 0 { format!("{}k", n / 1000) } else { n.to_string() };
        if want("uniform") {
            datasets.push((format!("UNIFORM-{label}"), Box::new(move || Some(generate(n, false, 11 + n as u64)))));
        }
        if want("zipf") {
            datasets.push((format!("ZIPF-{label}"), Box::new(move || Some(generate(n, true, 13 + n as u64)))));
        }
    }
    datasets
}

/// Run the benchmark (see the module docs).
pub fn run(options: Options) {
    let args = settings(options);
    if let Some(file) = &args.one {
        let t = args.thresholds.first().copied().unwrap_or(0.5);
        if let Err(e) = run_one(file, t, &args.engine) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        return;
    }
    if args.fresh {
        return run_fresh(&args);
    }
    let threads = default_threads();
    let gpu = setfusion::gpu::gpu(0);
    let device = match &gpu {
        Ok(g) => g.info().name.clone(),
        Err(e) => format!("none ({e})"),
    };
    let datasets = datasets(&args);
    let cpu_note = match (args.cpu, args.cpu_timeout) {
        (false, _) => " The CPU backend was not run (--no-cpu).".to_string(),
        (true, Some(d)) => format!(
            " CPU runs are stopped after {} s (\"stopped\": not finished; the GPU pairs are then unchecked).",
            d.as_secs_f64()
        ),
        (true, None) => String::new(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let sql_cpu = session(&rt, &["SET setfusion.strategy = 'cpu'"]).expect("a CPU-backend session");
    let sql_gpu = session(&rt, &["SET setfusion.min_rows = 0"]).expect("a GPU-backend session");
    let mut md = String::new();
    md += &format!(
        "# Set-similarity join benchmark (Jaccard self join)\n\nGPU: {device}; CPU backend: {threads} threads; median of {} run(s) per cell (1 when a run exceeds 10 s). Times in ms. CPU ms / GPU ms: the join alone, after preprocessing; prep CPU / prep GPU: the preprocessing on the host's cores and on the device (per dataset); SQL CPU / SQL GPU: `{}` end to end (planning, set encoding, preprocessing, join, count) with the CPU backend and the GPU backend.{cpu_note}\n\n",
        args.reps,
        self_join_sql(0.5).replace("0.5", "t"),
    );
    let mut sql_notes = String::from("\n## How the SQL GPU runs ran (the operator's report, last run of each cell)\n\n| dataset | t | ran |\n| --- | ---: | --- |\n");
    let mut breakdown = String::from(
        "\n## GPU time breakdown (last run of each cell)\n\nplan: host length tables + prefix index; upload: one transfer of collection + index; kernel: launches until their results are counted; download: counters + result triples.\n\n| dataset | t | GPU ms | plan ms | upload ms | kernel ms | download ms | index entries visited | launches |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    md += "| dataset | sets | avg size | prep CPU ms | prep GPU ms | t | pairs | CPU ms | GPU ms | GPU speedup | SQL CPU ms | SQL GPU ms | SQL speedup | CPU candidates | GPU candidates | GPU blocks |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    if let Ok(g) = &gpu {
        // Compile the kernels before timing.
        let tiny = RawSets::from_vecs(&[vec![1, 2], vec![1, 2]]);
        let (c, _) = preprocess(&tiny, None);
        let _l = g.lock_blocking();
        let _ = ssjoin_gpu(g, &c, None, Threshold::new(Metric::Jaccard, 0.5), &mut JoinStats::default());
        if let Ok(input) = device_input(&tiny, None, 0) {
            let _ = preprocess_gpu(g, &input, &mut TransferStats::default());
        }
    }
    let mut smallest: Option<(String, RawSets)> = None;
    for (name, make) in &datasets {
        let Some(raw) = make() else { continue };
        let mut c = SetCollection::default();
        let mut prep_times = vec![];
        for _ in 0..args.reps {
            let t = Instant::now();
            c = preprocess(&raw, None).0;
            prep_times.push(t.elapsed());
        }
        let prep = median(prep_times);
        let prep_gpu = match (&gpu, device_input(&raw, None, 0)) {
            (Ok(g), Ok(input)) => {
                let _l = g.lock_blocking();
                let mut times = vec![];
                let mut cell = None;
                for _ in 0..args.reps {
                    let t = Instant::now();
                    match preprocess_gpu(g, &input, &mut TransferStats::default()) {
                        Ok((dc, _)) if dc == c => times.push(t.elapsed()),
                        Ok(_) => cell = Some("MISMATCH".to_string()),
                        Err(e) => cell = Some(format!("error: {e}")),
                    }
                }
                cell.unwrap_or_else(|| ms(median(times)))
            }
            (Ok(_), Err(why)) => format!("- ({why})"),
            (Err(_), _) => "-".into(),
        };
        let batch = table(&raw);
        for ctx in [&sql_cpu, &sql_gpu] {
            register(ctx, &batch).expect("registering the table");
        }
        let avg = c.tokens.len() as f64 / c.len().max(1) as f64;
        for &t in &args.thresholds {
            let thr = Threshold::new(Metric::Jaccard, t);
            let mut cst = JoinStats::default();
            let cpu = if args.cpu {
                timed(args.reps, || {
                    cst = JoinStats::default();
                    let deadline = args.cpu_timeout.map(|d| Instant::now() + d);
                    ssjoin_cpu_until(&c, None, thr, threads, &mut cst, &|_| {
                        deadline.is_some_and(|d| Instant::now() >= d)
                    })
                })
            } else {
                None
            };
            let cpu_cell = match (&cpu, args.cpu, args.cpu_timeout) {
                (Some((d, _)), _, _) => ms(*d),
                (None, false, _) => "not run".to_string(),
                (None, true, Some(d)) => format!("stopped at {} s", d.as_secs_f64()),
                (None, true, None) => "not run".to_string(),
            };
            let cpu_out = cpu.as_ref().map(|(_, o)| sorted(o.clone()));
            let mut pairs = cpu_out.as_ref().map(|o| o.len().to_string()).unwrap_or_else(|| "-".into());
            let (gpu_cell, speed, gcand, gblocks) = match &gpu {
                Ok(g) => {
                    let mut gst = JoinStats::default();
                    let mut err = None;
                    let run = timed(args.reps, || {
                        let _l = g.lock_blocking();
                        gst = JoinStats::default();
                        match ssjoin_gpu(g, &c, None, thr, &mut gst) {
                            Ok(v) => Some(v),
                            Err(e) => {
                                err = Some(e.to_string());
                                None
                            }
                        }
                    });
                    match (run, err) {
                        (Some((gpu_t, gpu_out)), None) => {
                            let gpu_out = sorted(gpu_out);
                            let cell = match &cpu_out {
                                Some(o) if *o == gpu_out => ms(gpu_t),
                                Some(_) => format!("{} (MISMATCH)", ms(gpu_t)),
                                None => {
                                    pairs = format!("{} (GPU, unchecked)", gpu_out.len());
                                    ms(gpu_t)
                                }
                            };
                            let speed = match (&cpu, args.cpu_timeout) {
                                (Some((cpu_t, _)), _) => {
                                    format!("{:.1}x", cpu_t.as_secs_f64() / gpu_t.as_secs_f64().max(1e-9))
                                }
                                (None, Some(d)) if args.cpu => {
                                    format!("> {:.1}x", d.as_secs_f64() / gpu_t.as_secs_f64().max(1e-9))
                                }
                                _ => "-".into(),
                            };
                            let tr = &gst.transfer;
                            breakdown += &format!(
                                "| {name} | {t} | {} | {} | {} | {} | {} | {} | {} |\n",
                                ms(gpu_t),
                                ms(gst.plan),
                                ms(tr.to_device),
                                ms(tr.kernel),
                                ms(tr.to_host),
                                gst.hits,
                                gst.blocks
                            );
                            (cell, speed, gst.candidates.to_string(), gst.blocks.to_string())
                        }
                        (_, e) => (format!("error: {}", e.unwrap_or_default()), "-".into(), "-".into(), "-".into()),
                    }
                }
                Err(_) => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let cpu_cand = if cpu.is_some() { cst.candidates.to_string() } else { "-".into() };
            let q = self_join_sql(t);
            let want = cpu_out.as_ref().map(|o| o.len() as i64);
            let sql_cell = |r: datafusion::error::Result<(Duration, i64, String)>| match r {
                Ok((d, n, _)) if want.is_none_or(|w| w == n) => (ms(d), Some(d)),
                Ok((d, n, _)) => (format!("{} (MISMATCH: count {n})", ms(d)), None),
                Err(e) => (format!("error: {e}"), None),
            };
            let (sql_cpu_cell, sql_cpu_t) =
                if cpu.is_some() { sql_cell(time_sql(&rt, &sql_cpu, &q, args.reps)) } else { ("not run".into(), None) };
            let (sql_gpu_cell, sql_gpu_t) = if gpu.is_ok() {
                let r = time_sql(&rt, &sql_gpu, &q, args.reps);
                if let Ok((_, _, ran)) = &r {
                    sql_notes += &format!("| {name} | {t} | {ran} |\n");
                }
                sql_cell(r)
            } else {
                ("-".into(), None)
            };
            let sql_speed = match (sql_cpu_t, sql_gpu_t) {
                (Some(c), Some(g)) => format!("{:.1}x", c.as_secs_f64() / g.as_secs_f64().max(1e-9)),
                _ => "-".into(),
            };
            let row = format!(
                "| {name} | {} | {avg:.1} | {} | {prep_gpu} | {t} | {pairs} | {cpu_cell} | {gpu_cell} | {speed} | {sql_cpu_cell} | {sql_gpu_cell} | {sql_speed} | {cpu_cand} | {gcand} | {gblocks} |\n",
                c.len(),
                ms(prep),
            );
            print!("{row}");
            md += &row;
        }
        if smallest.as_ref().is_none_or(|(_, s)| raw.len() < s.len()) {
            smallest = Some((name.clone(), raw));
        }
    }
    if gpu.is_ok() {
        md += &breakdown;
        md += &sql_notes;
    }
    if args.nlj {
        if let Some((name, raw)) = &smallest {
            // The nested loop is quadratic (18k DBLP sets took 517 s on 2 cores):
            // run it on the first NLJ_SETS sets of the smallest collection.
            let n = crate::env::ssjoin_nlj_sets().unwrap_or(4000usize).min(raw.len());
            let mut sub = RawSets::new();
            for i in 0..n {
                sub.push(raw.set(i).iter().copied());
            }
            md += &nested_loop_section(&format!("{name}, first {n}"), &sub);
        }
    }
    println!("\n{md}");
    if let Some(path) = &args.out {
        std::fs::write(path, &md).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        eprintln!("wrote {path}");
    }
}

/// DataFusion's nested-loop plan vs the SQL similarity join, at 0.9.
/// One query in this (fresh) process: the self join of `file` at `t`,
/// printing `ms=<query time> rows=<pair count>` and `ran=<the operator's report>`.
fn run_one(file: &std::path::Path, t: f64, engine: &str) -> datafusion::error::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (engine, whole) = match engine.strip_suffix("-whole") {
        Some(e) => (e, true),
        None => (engine, false),
    };
    let mut settings: Vec<&str> = match engine {
        "cpu" => vec!["SET setfusion.strategy = 'cpu'"],
        // The device, opened at planning and waited for (how `auto` ran before it stopped waiting).
        "wait" => vec!["SET setfusion.strategy = 'hash'"],
        _ => vec![],
    };
    if whole {
        settings.push("SET setfusion.scan_ranges = false");
    }
    let ctx = session(&rt, &settings)?;
    let path = file.to_string_lossy().to_string();
    rt.block_on(ctx.register_parquet("d", &path, datafusion::prelude::ParquetReadOptions::default()))?;
    let (took, count, ran) = time_sql(&rt, &ctx, &self_join_sql(t), 1)?;
    println!("ms={:.3} rows={count}", took.as_secs_f64() * 1e3);
    println!("ran={ran}");
    Ok(())
}

/// The longest a fresh one-query process may run.
const CHILD_LIMIT: Duration = Duration::from_secs(300);

/// `--fresh`: each collection written once as Parquet (`d(id, g)`, under
/// `SETFUSION_PARQUET_DIR`), then its SQL self join at each threshold in
/// `--reps` fresh processes of the CPU backend and of setfusion's default
/// (`auto`: the cost model, the device started only for a GPU plan, the host
/// joining until it is ready). Pair counts are checked equal.
fn run_fresh(args: &Args) {
    let dir = crate::env::parquet_bench_dir().join("ssjoin");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return;
    }
    let mut md = format!(
        "# Set-similarity join from Parquet, fresh processes\n\n`{}` over one Parquet file per collection; each cell the median of {} one-query process(es) (the query's time: planning, scan, set encoding, preprocessing, join, count; the device starts inside the query's process). CPU = `setfusion.strategy = 'cpu'`; setfusion = its defaults; GPU waited = `setfusion.strategy = 'hash'` (the device opened at planning and waited for, as the default did before it stopped waiting). Warm: the same query again in this process (median of {1} after one run), the device started; the sets kept by the first run (`setfusion.sets_cache_limit`), and, in the next three columns, read and preprocessed again in every query (`sets_cache_limit = 0`).\n\n| dataset | sets | t | pairs | CPU ms | setfusion ms | speedup | GPU waited ms | CPU warm ms | setfusion warm ms | warm speedup | CPU warm, read ms | setfusion warm, read ms | warm read speedup | setfusion ran (fresh) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        self_join_sql(0.5).replace("0.5", "t"),
        args.reps,
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let warm_cpu = session(&rt, &["SET setfusion.strategy = 'cpu'"]).expect("a CPU-backend session");
    let warm_auto = session(&rt, &[]).expect("a default session");
    // The same, reading and preprocessing the sets in every query (none kept between queries).
    let no_kept = "SET setfusion.sets_cache_limit = 0";
    let read_cpu = session(&rt, &["SET setfusion.strategy = 'cpu'", no_kept]).expect("a CPU-backend session");
    let read_auto = session(&rt, &[no_kept]).expect("a default session");
    for (name, make) in datasets(args) {
        let Some(raw) = make() else { continue };
        let file = dir.join(format!("{}.parquet", name.to_lowercase().replace([' ', '-'], "_")));
        if let Err(e) = write_parquet(&file, &table(&raw)) {
            eprintln!("writing {}: {e}", file.display());
            return;
        }
        let path = file.to_string_lossy().to_string();
        for ctx in [&warm_cpu, &warm_auto, &read_cpu, &read_auto] {
            let _ = ctx.deregister_table("d");
            rt.block_on(ctx.register_parquet("d", &path, datafusion::prelude::ParquetReadOptions::default()))
                .expect("registering the Parquet file");
        }
        for &t in &args.thresholds {
            let run = |engine: &str| {
                let child: Vec<String> = [
                    "bench",
                    "ssjoin",
                    "--one",
                    &file.to_string_lossy(),
                    "--thresholds",
                    &t.to_string(),
                    "--engine",
                    engine,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                super::fresh_runs(&child, &name, args.reps, CHILD_LIMIT)
            };
            let waited = match run("wait") {
                Ok((w, _, _)) => ms(w),
                Err(e) => e.to_string(),
            };
            // Warm: one run first (the default session's first query starts the device).
            let warm = |ctx: &SessionContext| {
                let q = self_join_sql(t);
                time_sql(&rt, ctx, &q, 1).and_then(|_| time_sql(&rt, ctx, &q, args.reps)).map(|(d, _, _)| d)
            };
            let pair = |c: datafusion::error::Result<Duration>, g: datafusion::error::Result<Duration>| match (c, g) {
                (Ok(c), Ok(g)) => format!("{} | {} | {:.2}x", ms(c), ms(g), c.as_secs_f64() / g.as_secs_f64()),
                (c, g) => {
                    format!("{} | {} | -", c.map_or_else(|e| e.to_string(), ms), g.map_or_else(|e| e.to_string(), ms))
                }
            };
            let warm =
                format!("{} | {}", pair(warm(&warm_cpu), warm(&warm_auto)), pair(warm(&read_cpu), warm(&read_auto)));
            let line = match (run("cpu"), run("auto")) {
                (Ok((c, cp, _)), Ok((g, gp, ran))) => {
                    let pairs = if cp == gp { cp.to_string() } else { format!("MISMATCH {cp} / {gp}") };
                    format!(
                        "| {name} | {} | {t} | {pairs} | {} | {} | {:.2}x | {waited} | {warm} | {ran} |\n",
                        raw.len(),
                        ms(c),
                        ms(g),
                        c.as_secs_f64() / g.as_secs_f64()
                    )
                }
                (c, g) => format!(
                    "| {name} | {} | {t} | - | {} | {} | - | {waited} | {warm} | - |\n",
                    raw.len(),
                    c.map_or_else(|e| e.to_string(), |r| ms(r.0)),
                    g.map_or_else(|e| e.to_string(), |r| ms(r.0))
                ),
            };
            eprint!("{line}");
            md += &line;
        }
    }
    println!("{md}");
    if let Some(path) = &args.out {
        if let Err(e) = std::fs::write(path, &md) {
            eprintln!("writing {path}: {e}");
        }
    }
}

/// Write `batch` as one Parquet file (the writer's defaults).
fn write_parquet(path: &std::path::Path, batch: &RecordBatch) -> datafusion::error::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None)?;
    w.write(batch)?;
    w.close()?;
    Ok(())
}

fn nested_loop_section(name: &str, raw: &RawSets) -> String {
    let batch = table(raw);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let q = self_join_sql(0.9);
    let mut out =
        format!("\n## SQL on {name} ({} sets): `{q}`\n\n| plan | ms | count |\n| --- | ---: | ---: |\n", raw.len());
    for (label, settings) in [
        ("DataFusion nested-loop join (setfusion.enabled = false)", vec!["SET setfusion.enabled = false"]),
        ("SimilarityJoinExec, CPU backend", vec!["SET setfusion.strategy = 'cpu'"]),
        ("SimilarityJoinExec, auto (GPU when present)", vec!["SET setfusion.min_rows = 0"]),
    ] {
        let r = session(&rt, &settings).and_then(|ctx| {
            register(&ctx, &batch)?;
            time_sql(&rt, &ctx, &q, 1)
        });
        match r {
            Ok((d, n, _)) => {
                println!("{label}: {} ms, count {n}", ms(d));
                out += &format!("| {label} | {} | {n} |\n", ms(d));
            }
            Err(e) => out += &format!("| {label} | error: {e} | - |\n"),
        }
    }
    out
}
