//! Set-similarity join benchmark (issue 4): GPU backend vs CPU backend.
//!
//! ```text
//! cargo bench --bench ssjoin -- [--out FILE] [--quick] [--reps N] [--no-nlj]
//! ```
//! (or `SSJOIN_BENCH_OUT=FILE`). Datasets: DBLP 18k titles as lower-cased
//! 3-gram sets (../shared/data/dblp_t_18k.txt), and generated UNIFORM and
//! ZIPF collections of 100,000 and 1,000,000 sets (set sizes uniform in
//! [10, 50], average 30; UNIFORM: tokens uniform over 100,000; ZIPF: Zipf
//! exponent 1.0 over 100,000 tokens; 1% of the sets are near-duplicates of an
//! earlier set with ~10% of the tokens replaced, so every threshold has
//! answers). Tokens are renumbered by ascending frequency by the shared
//! preprocessing, which is timed separately. Jaccard thresholds 0.5..0.9.
//! Each backend: median of `--reps` runs (default 3; 1 when a run takes
//! more than 60 s); results are checked equal. `--quick`: 100k sets only.
//! DataFusion's own nested-loop plan (setfusion disabled) and the SQL
//! similarity join run on the first 4,000 sets of the smallest collection
//! (DBLP; `SSJOIN_BENCH_NLJ_SETS` changes it) at 0.9.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use crate::algo::ssjoin::{
    default_threads, preprocess, ssjoin_cpu_with, ssjoin_gpu, JoinStats, Metric, Pair, RawSets, SetCollection, Threshold,
};

struct Args {
    out: Option<String>,
    quick: bool,
    reps: usize,
    nlj: bool,
}

fn args(v: Vec<String>) -> Args {
    let mut a = Args { out: std::env::var("SSJOIN_BENCH_OUT").ok(), quick: false, reps: 3, nlj: true };
    let mut i = 0;
    while i < v.len() {
        match v[i].as_str() {
            "--out" => {
                a.out = v.get(i + 1).cloned();
                i += 1;
            }
            "--quick" => a.quick = true,
            "--no-nlj" => a.nlj = false,
            "--reps" => {
                a.reps = v.get(i + 1).and_then(|x| x.parse().ok()).unwrap_or(3).max(1);
                i += 1;
            }
            _ => {} // cargo bench passes --bench
        }
        i += 1;
    }
    a
}

fn dblp() -> Option<RawSets> {
    let dir = std::env::var_os("SETFUSION_DATA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"));
    let path = dir.join("dblp_t_18k.txt");
    let text = std::fs::read_to_string(path).ok()?;
    let mut dict: HashMap<String, u64> = HashMap::new();
    let mut raw = RawSets::new();
    for line in text.lines() {
        let title = line.split_once('#').map(|(_, t)| t).unwrap_or(line);
        let keys: Vec<u64> = crate::udf::qgram_tokens(&title.to_lowercase(), 3)
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

fn generate(n: usize, zipf: bool, seed: u64) -> RawSets {
    const UNIVERSE: usize = 100_000;
    let mut rng = StdRng::seed_from_u64(seed);
    let cdf: Vec<f64> = if zipf {
        (1..=UNIVERSE)
            .scan(0.0, |a, i| {
                *a += 1.0 / i as f64;
                Some(*a)
            })
            .collect()
    } else {
        Vec::new()
    };
    let total = cdf.last().copied().unwrap_or(1.0);
    let draw = |rng: &mut StdRng| -> u64 {
        if zipf {
            let u = rng.random::<f64>() * total;
            cdf.partition_point(|&c| c < u) as u64
        } else {
            rng.random_range(0..UNIVERSE as u64)
        }
    };
    let mut raw = RawSets::new();
    for i in 0..n {
        if i > 0 && rng.random_range(0..100) == 0 {
            let src = rng.random_range(0..i);
            let mut s: Vec<u64> = raw.set(src).to_vec();
            for x in s.iter_mut() {
                if rng.random_range(0..10) == 0 {
                    *x = draw(&mut rng);
                }
            }
            raw.push(s);
        } else {
            let k = rng.random_range(10..=50);
            let s: Vec<u64> = (0..k).map(|_| draw(&mut rng)).collect();
            raw.push(s);
        }
    }
    raw
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Run `f` up to `reps` times (once if a run takes more than 60 s).
fn timed(reps: usize, mut f: impl FnMut() -> Vec<Pair>) -> (Duration, Vec<Pair>) {
    let mut times = vec![];
    let mut out = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        out = f();
        let e = t.elapsed();
        times.push(e);
        if e > Duration::from_secs(60) {
            break;
        }
    }
    (median(times), out)
}

fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
    v.sort_unstable();
    v
}

/// Run the benchmark with command-line style arguments (see the module docs).
pub fn run(argv: Vec<String>) {
    let args = args(argv);
    let threads = default_threads();
    let gpu = crate::gpu::gpu(0);
    let device = match &gpu {
        Ok(g) => g.info().name.clone(),
        Err(e) => format!("none ({e})"),
    };
    let mut datasets: Vec<(String, RawSets)> = vec![];
    if let Some(d) = dblp() {
        datasets.push(("DBLP-18k 3-grams".into(), d));
    } else {
        eprintln!("dblp_t_18k.txt not found: skipping DBLP");
    }
    let sizes: &[usize] = if args.quick { &[100_000] } else { &[100_000, 1_000_000] };
    for &n in sizes {
        datasets.push((format!("UNIFORM-{}k", n / 1000), generate(n, false, 11 + n as u64)));
        datasets.push((format!("ZIPF-{}k", n / 1000), generate(n, true, 13 + n as u64)));
    }
    let mut md = String::new();
    md += &format!(
        "# Set-similarity join benchmark (Jaccard self join)\n\nGPU: {device}; CPU backend: {threads} threads; median of {} run(s) per cell (1 when a run exceeds 60 s). Times in ms, excluding the shared preprocessing (shown per dataset).\n\n",
        args.reps
    );
    md += "| dataset | sets | avg size | preprocess ms | t | pairs | CPU ms | GPU ms | GPU speedup | CPU candidates | GPU candidates | GPU blocks |\n";
    md += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    if let Ok(g) = &gpu {
        // Compile the kernels before timing.
        let (c, _) = preprocess(&RawSets::from_vecs(&[vec![1, 2], vec![1, 2]]), None);
        let _l = g.lock_blocking();
        let _ = ssjoin_gpu(g, &c, None, Threshold::new(Metric::Jaccard, 0.5), &mut JoinStats::default());
    }
    for (name, raw) in &datasets {
        let t = Instant::now();
        let (c, _): (SetCollection, _) = preprocess(raw, None);
        let prep = t.elapsed();
        let avg = c.tokens.len() as f64 / c.len().max(1) as f64;
        for t in [0.5, 0.6, 0.7, 0.8, 0.9] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let mut cst = JoinStats::default();
            let (cpu_t, cpu_out) = timed(args.reps, || {
                cst = JoinStats::default();
                ssjoin_cpu_with(&c, None, thr, threads, &mut cst)
            });
            let cpu_out = sorted(cpu_out);
            let (gpu_cell, speed, gcand, gblocks) = match &gpu {
                Ok(g) => {
                    let mut gst = JoinStats::default();
                    let mut err = None;
                    let (gpu_t, gpu_out) = timed(args.reps, || {
                        let _l = g.lock_blocking();
                        gst = JoinStats::default();
                        match ssjoin_gpu(g, &c, None, thr, &mut gst) {
                            Ok(v) => v,
                            Err(e) => {
                                err = Some(e.to_string());
                                vec![]
                            }
                        }
                    });
                    if let Some(e) = err {
                        (format!("error: {e}"), "-".into(), "-".into(), "-".into())
                    } else {
                        let ok = sorted(gpu_out) == cpu_out;
                        let cell = if ok { ms(gpu_t) } else { format!("{} (MISMATCH)", ms(gpu_t)) };
                        (
                            cell,
                            format!("{:.1}x", cpu_t.as_secs_f64() / gpu_t.as_secs_f64().max(1e-9)),
                            gst.candidates.to_string(),
                            gst.blocks.to_string(),
                        )
                    }
                }
                Err(_) => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let row = format!(
                "| {name} | {} | {avg:.1} | {} | {t} | {} | {} | {gpu_cell} | {speed} | {} | {gcand} | {gblocks} |\n",
                c.len(),
                ms(prep),
                cpu_out.len(),
                ms(cpu_t),
                cst.candidates
            );
            print!("{row}");
            md += &row;
        }
    }
    if args.nlj {
        if let Some((name, raw)) = datasets.first() {
            // The nested loop is quadratic (18k DBLP sets took 517 s on 2 cores):
            // run it on the first NLJ_SETS sets of the smallest collection.
            let n = std::env::var("SSJOIN_BENCH_NLJ_SETS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000usize).min(raw.len());
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
fn nested_loop_section(name: &str, raw: &RawSets) -> String {
    use datafusion::arrow::array::{Int32Array, ListBuilder, UInt64Builder};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use std::sync::Arc;
    let mut lb = ListBuilder::new(UInt64Builder::new());
    for i in 0..raw.len() {
        lb.values().append_slice(raw.set(i));
        lb.append(true);
    }
    let ids = Int32Array::from_iter_values(0..raw.len() as i32);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("g", DataType::List(Arc::new(Field::new("item", DataType::UInt64, true))), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(lb.finish())]).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let q = "SELECT count(*) FROM d a JOIN d b ON a.id < b.id AND jaccard(a.g, b.g) >= 0.9";
    let mut out = format!("\n## SQL on {name} ({} sets): `{q}`\n\n| plan | ms | count |\n| --- | ---: | ---: |\n", raw.len());
    for (label, settings) in [
        ("DataFusion nested-loop join (setfusion.enabled = false)", vec!["SET setfusion.enabled = false"]),
        ("SimilarityJoinExec, CPU backend", vec!["SET setfusion.strategy = 'cpu'"]),
        ("SimilarityJoinExec, auto (GPU when present)", vec!["SET setfusion.min_rows = 0"]),
    ] {
        let r = rt.block_on(async {
            let ctx = crate::context();
            for s in settings {
                ctx.sql(s).await?.collect().await?;
            }
            let mem = datafusion::datasource::MemTable::try_new(schema.clone(), vec![vec![batch.clone()]])?;
            ctx.register_table("d", Arc::new(mem))?;
            let t = Instant::now();
            let b = ctx.sql(q).await?.collect().await?;
            let n = b[0].column(0).as_any().downcast_ref::<datafusion::arrow::array::Int64Array>().unwrap().value(0);
            Ok::<_, datafusion::error::DataFusionError>((t.elapsed(), n))
        });
        match r {
            Ok((d, n)) => {
                println!("{label}: {} ms, count {n}", ms(d));
                out += &format!("| {label} | {} | {n} |\n", ms(d));
            }
            Err(e) => out += &format!("| {label} | error: {e} | - |\n"),
        }
    }
    out
}
