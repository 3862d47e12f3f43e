//! `setfusion bench families [--sizes K,..] [--kinds uniform,similar] [--cpu-max K] [--runs N]`:
//! the intersection of two families (issue 15, seed 000's experiments).
//!
//! * uniform: k = k' sets of 100 to 150 elements drawn uniformly from a
//!   domain of 100,000 (the paper's "uniformly distributed random sets");
//! * similar: the paper does not describe its generator, only that domain
//!   reduction shrinks the families hugely and few elements occur in both.
//!   Here each family has its own 50 base sets (100 to 150 elements over the
//!   same domain of 100,000), and every set is one of its family's bases
//!   with about 10% of its elements replaced at random: sets within a
//!   family are similar, and the two families share few elements.
//!
//! For each size: the GPU backend (device time from the families' arrays,
//! uploads and downloads included), the same through SQL (`SELECT count(*)
//! FROM intersect_families('f', 'g')` over in-memory tables, one row per
//! set), and the CPU backend through SQL up to `--cpu-max` sets; the GPU's
//! distinct sets are checked against the CPU's wherever both ran.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Int32Array, ListArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};

use setfusion::algo::families::{self, Family, PairSpace};
use setfusion::gpu::TransferStats;

/// `setfusion bench families`' options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Sets per family (k = k'), one measurement per size
    #[arg(long, value_name = "K,..", value_delimiter = ',', default_values_t = [5_000, 10_000, 20_000, 50_000])]
    pub sizes: Vec<usize>,
    /// Kinds of families (see the module documentation)
    #[arg(long, value_name = "KIND,..", value_delimiter = ',', value_parser = ["uniform", "similar"], default_values = ["uniform", "similar"])]
    pub kinds: Vec<String>,
    /// Largest size the CPU backend runs
    #[arg(long, value_name = "K", default_value_t = 10_000)]
    pub cpu_max: usize,
    /// Timed runs per measurement (the median); 0 counts as 1
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: usize,
}

/// The "similar" families: see the module documentation.
pub(crate) fn similar(k: usize, seed: u64) -> (Family, Family) {
    let mut next = families::tests_data::xorshift(seed);
    let mut fam = |k: usize| {
        // Each family has its own 50 base sets.
        let bases: Vec<Vec<u32>> =
            (0..50).map(|_| (0..100 + next() % 51).map(|_| (next() % 100_000) as u32).collect()).collect();
        let sets: Vec<Vec<u32>> = (0..k)
            .map(|_| {
                let mut set = bases[(next() % 50) as usize].clone();
                for e in set.iter_mut() {
                    if next() % 10 == 0 {
                        *e = (next() % 100_000) as u32;
                    }
                }
                set
            })
            .collect();
        Family::from_sets(&sets)
    };
    let f = fam(k);
    let g = fam(k);
    (f, g)
}

/// A wide table (id, elements) of a family.
fn table(f: &Family) -> Result<Arc<MemTable>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("elements", DataType::List(Arc::new(Field::new("item", DataType::Int32, true))), true),
    ]));
    let ids = Int32Array::from_iter_values(0..f.len() as i32);
    let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
        (0..f.len()).map(|i| Some(f.set(i).iter().map(|&e| Some(e as i32)))),
    );
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(lists)])?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

pub(crate) async fn sql_time(f: &Family, g: &Family, cpu: bool, runs: usize) -> Result<(Duration, i64)> {
    let ctx = setfusion::context();
    ctx.register_table("f", table(f)?)?;
    ctx.register_table("g", table(g)?)?;
    ctx.sql(if cpu { "SET setfusion.strategy = 'cpu'" } else { "SET setfusion.min_rows = 0" }).await?.collect().await?;
    let mut times = Vec::new();
    let mut rows = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let b = ctx.sql("SELECT count(*), sum(frequency) FROM intersect_families('f', 'g')").await?.collect().await?;
        times.push(t.elapsed());
        rows = b[0].column(0).as_any().downcast_ref::<datafusion::arrow::array::Int64Array>().map_or(0, |a| a.value(0));
    }
    Ok((super::median(times), rows))
}

pub async fn run(mut a: Options) -> Result<()> {
    a.runs = a.runs.max(1);
    let gpu = setfusion::gpu::gpu(0).ok();
    if gpu.is_none() {
        println!("no GPU: CPU backend only");
    }
    println!(
        "| kind | k = k' | pairs | distinct sets | GPU backend | GPU via SQL | CPU via SQL | SQL speedup | check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for kind in &a.kinds {
        for &k in &a.sizes {
            let (f, g) = match kind.as_str() {
                "uniform" => families::tests_data::uniform(k, 42),
                "similar" => similar(k, 42),
                other => return Err(DataFusionError::Plan(format!("bench families: unknown kind {other}"))),
            };
            let space = PairSpace { left: &f, right: &g, right_from: None };
            let mut gpu_res = None;
            let mut gpu_ms = "-".to_string();
            let mut gpu_sql = "-".to_string();
            if let Some(gpu) = &gpu {
                let mut times = Vec::new();
                for _ in 0..a.runs {
                    let lease = gpu.lease(0);
                    let mut ts = TransferStats::default();
                    let t = Instant::now();
                    let r = families::distinct_gpu(&lease, &space, &mut ts)?;
                    times.push(t.elapsed());
                    gpu_res = Some(r);
                }
                gpu_ms = format!("{:.1} ms", super::median(times).as_secs_f64() * 1e3);
                let (t, _) = sql_time(&f, &g, false, a.runs).await?;
                gpu_sql = format!("{:.1} ms", t.as_secs_f64() * 1e3);
            }
            let (cpu_sql, cpu_res) = if k <= a.cpu_max {
                let (t, _) = sql_time(&f, &g, true, 1.max(a.runs.min(2))).await?;
                (Some(t), Some(families::distinct_cpu(&space)))
            } else {
                (None, None)
            };
            let check = match (&gpu_res, &cpu_res) {
                (Some((gd, _)), Some(cd)) => {
                    if gd == cd {
                        "equal".to_string()
                    } else {
                        "DIFFERENT".to_string()
                    }
                }
                _ => "-".into(),
            };
            let distinct = gpu_res.as_ref().map(|(d, _)| d.len()).or(cpu_res.as_ref().map(|d| d.len())).unwrap_or(0);
            let speedup = match (cpu_sql, gpu_sql.trim_end_matches(" ms").parse::<f64>().ok()) {
                (Some(c), Some(g)) => format!("{:.1}x", c.as_secs_f64() * 1e3 / g),
                _ => "-".into(),
            };
            println!(
                "| {kind} | {k} | {} | {distinct} | {gpu_ms} | {gpu_sql} | {} | {speedup} | {check} |",
                space.pair_count(0..f.len()),
                cpu_sql.map_or("-".into(), |t| format!("{:.1} ms", t.as_secs_f64() * 1e3)),
            );
        }
    }
    Ok(())
}
