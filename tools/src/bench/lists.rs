//! `setfusion bench lists [--rows N] [--max-len N] [--domain N] [--partitions N] [--batch-rows N]
//! [--distinct-rows N] [--runs N] [--queries N] [--terms N] [--max-list N] [--skip-rows] [--skip-kway] [--strings]`: the
//! list functions and the k-way intersection (issue 15).
//!
//! (a) `--rows` rows (default 10M) of two INT lists of 10 to `--max-len`
//! (1000) random values in [0, `--domain`) (10,000), in a memory table of
//! `--partitions` partitions (16) of `--batch-rows`-row batches (8192, DataFusion's
//! default batch size; the list functions see one batch per call). `SELECT sum(cardinality(f(a, b))) FROM t`
//! for f = `set_intersect_all` on the GPU (`setfusion.strategy = 'sort'`,
//! which forces the device), `set_intersect_all` on setfusion's per-row CPU
//! path (`strategy = 'cpu'`), and DataFusion's own `array_intersect` (a plain
//! SessionContext), and setfusion's default (`auto`: the cost model decides
//! per batch). Warm: one unmeasured run, then the median of `--runs` (3). The GPU
//! and CPU sums must agree (array_intersect's is smaller: it keeps distinct
//! values only). `--strings`: the same values written as strings (Utf8 lists;
//! the GPU path ranks each batch's strings on the host first). `--distinct-rows N`:
//! only the first N rows' batches are generated, and the table repeats them
//! (shared buffers) until it has `--rows`: 10M rows of string lists are ~80 GB
//! when every batch is distinct, more than the device machine's host holds.
//!
//! (b) `--terms` (64) posting lists of 1K to `--max-list` (10M) sorted
//! distinct ids (sizes log-uniform, ids in [0, 20M)); `--queries` (1,000)
//! queries of 2 to 8 random terms. GPU: the lists resident on the device
//! ([`DeviceLists`], uploaded once, not timed per query), SvS with one
//! thread per candidate; CPU: [`intersect_k`] (SvS with galloping), one
//! thread. Every query's results must agree.
//!
//! The markdown table is printed and written to `$SETFUSION_BENCH_OUT`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array as _, ArrayRef, Int32Array, Int64Array, ListArray, RecordBatch, StringArray};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{SessionConfig, SessionContext};
use rand::{Rng, SeedableRng};

use setfusion::algo::multiset::{intersect_k, DeviceLists};
use setfusion::gpu::TransferStats;

struct Args {
    rows: usize,
    max_len: usize,
    domain: i32,
    partitions: usize,
    batch_rows: usize,
    distinct_rows: usize,
    runs: usize,
    queries: usize,
    terms: usize,
    max_list: usize,
    skip_rows: bool,
    skip_kway: bool,
    strings: bool,
}

/// `setfusion bench lists`' options (see the module documentation).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// (a) rows of list pairs
    #[arg(long, value_name = "N", default_value_t = 10_000_000)]
    pub rows: usize,
    /// (a) longest list (lists have 10 to N values; at least 10)
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_len: usize,
    /// (a) values are drawn from [0, N)
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub domain: usize,
    /// (a) partitions of the memory table
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub partitions: usize,
    /// (a) rows per batch (DataFusion's default batch size)
    #[arg(long, value_name = "N", default_value_t = 8192)]
    pub batch_rows: usize,
    /// (a) generate only the first N rows' batches and repeat them (default: every batch distinct)
    #[arg(long, value_name = "N")]
    pub distinct_rows: Option<usize>,
    /// (a) timed runs per engine after its unmeasured one (the median)
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: usize,
    /// (a) the values written as strings (Utf8 lists)
    #[arg(long)]
    pub strings: bool,
    /// (b) k-way intersection queries
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub queries: usize,
    /// (b) posting lists (at least 2)
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub terms: usize,
    /// (b) longest posting list (at least 1000)
    #[arg(long, value_name = "N", default_value_t = 10_000_000)]
    pub max_list: usize,
    /// Skip (a), the list functions over rows
    #[arg(long)]
    pub skip_rows: bool,
    /// Skip (b), the k-way intersection
    #[arg(long)]
    pub skip_kway: bool,
}

/// The options with their floors applied.
fn settings(o: Options) -> Args {
    Args {
        rows: o.rows,
        max_len: o.max_len.max(10),
        domain: o.domain.clamp(1, i32::MAX as usize) as i32,
        partitions: o.partitions.max(1),
        batch_rows: o.batch_rows.max(1),
        distinct_rows: o.distinct_rows.unwrap_or(o.rows).clamp(1, o.rows.max(1)),
        runs: o.runs.max(1),
        queries: o.queries,
        terms: o.terms.max(2),
        max_list: o.max_list.max(1000),
        skip_rows: o.skip_rows,
        skip_kway: o.skip_kway,
        strings: o.strings,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The table of list pairs, `partitions` partitions of `--batch-rows`-row
/// batches (round robin). Batches are generated in parallel, each from its
/// own seed, so the data does not depend on the thread count (10M rows are
/// ~10G elements). Batch `bi` repeats batch `bi % distinct` (its buffers
/// shared), where `distinct` batches hold `--distinct-rows`.
fn list_table(a: &Args) -> Result<(Arc<MemTable>, usize)> {
    let elem = if a.strings { DataType::Utf8 } else { DataType::Int32 };
    let field = Arc::new(Field::new_list_field(elem, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::List(field.clone()), true),
        Field::new("b", DataType::List(field.clone()), true),
    ]));
    let batch_rows = a.batch_rows;
    let batches = a.rows.div_ceil(batch_rows);
    // Whole batches only, so a repeated batch is never a short last one.
    let distinct = a.distinct_rows.div_ceil(batch_rows).clamp(1, batches.max(1));
    let column = |rng: &mut rand::rngs::StdRng, n: usize| {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0i32);
        let mut values = Vec::new();
        for _ in 0..n {
            let len = rng.random_range(10..=a.max_len);
            values.extend((0..len).map(|_| rng.random_range(0..a.domain)));
            offsets.push(values.len() as i32);
        }
        let values: ArrayRef = if a.strings {
            Arc::new(StringArray::from_iter_values(values.iter().map(|v| v.to_string())))
        } else {
            Arc::new(Int32Array::new(ScalarBuffer::from(values), None))
        };
        ListArray::new(field.clone(), OffsetBuffer::new(ScalarBuffer::from(offsets)), values, None)
    };
    let make = |bi: usize| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(15 + bi as u64);
        let n = batch_rows.min(a.rows - bi * batch_rows);
        let (ca, cb) = (column(&mut rng, n), column(&mut rng, n));
        RecordBatch::try_new(schema.clone(), vec![Arc::new(ca), Arc::new(cb)])
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(distinct);
    let made: Vec<Vec<(usize, RecordBatch)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t..distinct).step_by(threads).map(|bi| make(bi).map(|b| (bi, b))).collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("list generator thread")).collect::<Result<_, _>>()
    })?;
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); a.partitions];
    let mut made: Vec<(usize, RecordBatch)> = made.into_iter().flatten().collect();
    made.sort_by_key(|(bi, _)| *bi);
    let last_rows = a.rows.saturating_sub(batches.saturating_sub(1) * batch_rows);
    let mut elements = 0;
    for bi in 0..batches {
        let b = &made[bi % distinct].1;
        // The last batch is cut to the rows left when it repeats a full one.
        let b = if bi + 1 == batches && b.num_rows() > last_rows { b.slice(0, last_rows) } else { b.clone() };
        elements += b
            .columns()
            .iter()
            .map(|c| {
                c.as_any().downcast_ref::<ListArray>().map_or(0, |l| {
                    let o = l.value_offsets();
                    (o[o.len() - 1] - o[0]) as usize
                })
            })
            .sum::<usize>();
        parts[bi % a.partitions].push(b);
    }
    Ok((Arc::new(MemTable::try_new(schema, parts)?), elements))
}

/// One unmeasured run, then the median of `runs`; the query's single BIGINT.
async fn timed(ctx: &SessionContext, sql: &str, runs: usize) -> Result<(Duration, i64)> {
    let run = || async {
        let t = Instant::now();
        let b = ctx.sql(sql).await?.collect().await?;
        let v =
            b[0].column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .map_or(-1, |c| if c.is_null(0) { -1 } else { c.value(0) });
        Ok::<_, DataFusionError>((t.elapsed(), v))
    };
    run().await?;
    let mut times = Vec::new();
    let mut value = 0;
    for _ in 0..runs {
        let (t, v) = run().await?;
        times.push(t);
        value = v;
    }
    Ok((super::median(times), value))
}

async fn bench_rows(a: &Args, report: &mut String) -> Result<()> {
    let t = Instant::now();
    let (table, elements) = list_table(a)?;
    eprintln!("bench lists: {} rows, {elements} list elements generated in {:.1} s", a.rows, t.elapsed().as_secs_f64());
    let config = || SessionConfig::new().with_target_partitions(a.partitions).with_batch_size(a.batch_rows);
    let gpu_ok = setfusion::gpu::gpu(0).is_ok();
    let kind = if a.strings { "Utf8 (the integers written as strings)" } else { "INT" };
    let repeated = if a.distinct_rows < a.rows {
        format!(" (its first {} rows repeated)", (a.distinct_rows.div_ceil(a.batch_rows) * a.batch_rows).min(a.rows))
    } else {
        String::new()
    };
    writeln!(report, "### List functions: {} rows{repeated} of two {kind} lists of 10-{} values in [0, {}) ({elements} elements), {} partitions, batches of {} rows, warm, median of {}\n", a.rows, a.max_len, a.domain, a.partitions, a.batch_rows, a.runs).unwrap();
    writeln!(report, "| engine | query | time | sum of result lengths | vs array_intersect |").unwrap();
    writeln!(report, "|---|---|---|---|---|").unwrap();
    let df = SessionContext::new_with_config(config());
    df.register_table("t", table.clone())?;
    let (t_df, n_df) =
        timed(&df, "SELECT CAST(sum(cardinality(array_intersect(a, b))) AS BIGINT) FROM t", a.runs).await?;
    let mut rows = vec![("DataFusion", "array_intersect(a, b) (distinct)", t_df, n_df)];
    // setfusion's per-row CPU path, its default (the cost model decides per batch; the device
    // warm), and the device forced; every sum must equal the CPU's.
    let runs =
        [("setfusion CPU (per row)", "cpu"), ("setfusion default (auto)", "auto"), ("setfusion GPU (forced)", "sort")];
    let mut n_cpu = None;
    for (engine, strategy) in runs {
        if strategy != "cpu" && !gpu_ok {
            eprintln!("bench lists: no GPU, CPU rows only");
            break;
        }
        let ctx = setfusion::context_with_config(config());
        ctx.register_table("t", table.clone())?;
        ctx.sql(&format!("SET setfusion.strategy = '{strategy}'")).await?.collect().await?;
        let (t, n) =
            timed(&ctx, "SELECT CAST(sum(cardinality(set_intersect_all(a, b))) AS BIGINT) FROM t", a.runs).await?;
        if *n_cpu.get_or_insert(n) != n {
            return Err(DataFusionError::Execution(format!(
                "bench lists: {engine} sum {n} differs from the CPU's {n_cpu:?}"
            )));
        }
        rows.push((engine, "set_intersect_all(a, b)", t, n));
    }
    for (engine, q, t, n) in rows {
        writeln!(report, "| {engine} | `{q}` | {:.1} ms | {n} | {:.2}x |", ms(t), ms(t_df) / ms(t)).unwrap();
    }
    Ok(())
}

fn bench_kway(a: &Args, report: &mut String) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    const DOCS: i64 = 20_000_000;
    let t = Instant::now();
    let lists: Vec<Vec<i64>> = (0..a.terms)
        .map(|_| {
            let (lo, hi) = (1000f64.ln(), (a.max_list as f64).ln());
            let n = rng.random_range(lo..=hi).exp() as usize;
            let mut v: Vec<i64> = (0..n).map(|_| rng.random_range(0..DOCS)).collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let total: usize = lists.iter().map(|l| l.len()).sum();
    eprintln!("bench lists: {} posting lists, {total} ids generated in {:.1} s", a.terms, t.elapsed().as_secs_f64());
    let queries: Vec<Vec<usize>> =
        (0..a.queries).map(|_| (0..rng.random_range(2..=8)).map(|_| rng.random_range(0..a.terms)).collect()).collect();
    let t = Instant::now();
    let want: Vec<Vec<i64>> =
        queries.iter().map(|q| intersect_k(&q.iter().map(|&i| &lists[i][..]).collect::<Vec<_>>())).collect();
    let t_cpu = t.elapsed();
    let results: usize = want.iter().map(|w| w.len()).sum();
    writeln!(
        report,
        "\n### k-way intersection: {} queries of 2-8 terms over {} posting lists of 1K-{} ids ({total} ids, ids < 20M); {results} result ids in all\n",
        a.queries, a.terms, a.max_list
    )
    .unwrap();
    writeln!(report, "| backend | all queries | per query | speedup |").unwrap();
    writeln!(report, "|---|---|---|---|").unwrap();
    writeln!(
        report,
        "| CPU (SvS, galloping, one thread) | {:.1} ms | {:.3} ms | 1.00x |",
        ms(t_cpu),
        ms(t_cpu) / a.queries.max(1) as f64
    )
    .unwrap();
    if let Ok(g) = setfusion::gpu::gpu(0) {
        let lease = g.lease(0);
        let stats = &mut TransferStats::default();
        let t = Instant::now();
        let dl = DeviceLists::<i64>::upload(&lease, &lists, stats)?;
        lease.synchronize()?;
        let t_up = t.elapsed();
        // One unmeasured pass (kernel loading), then the timed one.
        for q in queries.iter().take(10) {
            dl.intersect(&lease, q, stats)?;
        }
        let t = Instant::now();
        for (q, w) in queries.iter().zip(&want) {
            let got = dl.intersect(&lease, q, stats)?;
            if &got != w {
                return Err(DataFusionError::Execution(format!(
                    "bench lists: GPU k-way result differs on terms {q:?}"
                )));
            }
        }
        let t_gpu = t.elapsed();
        writeln!(
            report,
            "| GPU (resident lists, SvS, a thread per candidate; upload once {:.1} ms) | {:.1} ms | {:.3} ms | {:.2}x |",
            ms(t_up),
            ms(t_gpu),
            ms(t_gpu) / a.queries.max(1) as f64,
            ms(t_cpu) / ms(t_gpu)
        )
        .unwrap();
    } else {
        eprintln!("bench lists: no GPU, CPU k-way only");
    }
    Ok(())
}

pub async fn run(options: Options) -> Result<()> {
    let a = settings(options);
    let mut report = String::from("## setfusion bench lists\n\n");
    if !a.skip_rows {
        bench_rows(&a, &mut report).await?;
    }
    if !a.skip_kway {
        bench_kway(&a, &mut report)?;
    }
    println!("{report}");
    if let Some(path) = crate::env::bench_out() {
        std::fs::write(&path, &report).ok();
    }
    Ok(())
}
