//! Benchmark for issue 3: DataFusion's native CPU plan vs setfusion, side by
//! side in one run, on tables a and b of N BIGINT rows held in memory
//! (a.k = (i * 2654435761) % 400000000, b.k = (i * 40503 + 7) % 400000000).
//! Plus device-resident microbenchmarks (sorted u32 intersection, hash semi join).
//!
//! ```text
//! cargo bench --bench setops_bench            # N = 100,000,000 (SETFUSION_BENCH_ROWS to change)
//! setfusion bench setops                      # the same program, from the release CLI
//! SETFUSION_BENCH_OUT=report.md setfusion bench setops
//! ```
//! Reports: median of SETFUSION_BENCH_RUNS (default 3) warm runs, the cold
//! (first) run separately, and setfusion's transfer and kernel time.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::median;
use crate::datagen;
use datafusion::error::Result;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion::algo::select::{self, GpuStrategy, SetOp};
use setfusion::algo::sorted_intersect::SortedIntersect;
use setfusion::gpu::{self, TransferStats};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Sum a named metric over every setfusion node of an executed plan.
fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let mut total = 0;
    if matches!(plan.name(), "SemiJoinExec" | "SetOpExec" | "MarkJoinExec") {
        if let Some(m) = plan.metrics() {
            total += m.sum_by_name(name).map_or(0, |v| v.as_usize());
        }
    }
    for c in plan.children() {
        total += metric(c, name);
    }
    total
}

#[derive(Default)]
struct Run {
    time: Duration,
    rows: usize,
    transfer_ns: usize,
    staging_ns: usize,
    kernel_ns: usize,
    input_ns: usize,
    encode_ns: usize,
    select_ns: usize,
    filter_ns: usize,
    bytes: usize,
}

async fn run_once(ctx: &SessionContext, sql: &str) -> Result<Run> {
    let t = Instant::now();
    setfusion::util::trace("query start");
    let df = ctx.sql(sql).await?;
    setfusion::util::trace("logical plan optimized");
    let plan = df.create_physical_plan().await?;
    let planned = t.elapsed();
    let batches = collect(plan.clone(), ctx.task_ctx()).await?;
    let time = t.elapsed();
    setfusion::util::trace(&format!("query collected (planned after {:.2} ms)", planned.as_secs_f64() * 1e3));
    let rows = if batches.len() == 1 && batches[0].num_rows() == 1 && batches[0].num_columns() == 1 {
        datafusion::arrow::util::display::array_value_to_string(batches[0].column(0), 0).unwrap().parse().unwrap_or(1)
    } else {
        batches.iter().map(|b| b.num_rows()).sum()
    };
    Ok(Run {
        time,
        rows,
        transfer_ns: metric(&plan, "transfer_time"),
        staging_ns: metric(&plan, "staging_copy_time"),
        input_ns: metric(&plan, "input_time"),
        encode_ns: metric(&plan, "key_encode_time"),
        select_ns: metric(&plan, "select_time"),
        filter_ns: metric(&plan, "output_filter_time"),
        kernel_ns: metric(&plan, "kernel_time"),
        bytes: metric(&plan, "bytes_to_device") + metric(&plan, "bytes_to_host"),
    })
}

/// Run the benchmark and print (and optionally write) the report.
pub async fn run() -> Result<()> {
    let n: u64 = crate::env::bench_rows().unwrap_or(100_000_000);
    let runs: usize = crate::env::bench_runs().unwrap_or(3);
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let mut report = String::new();
    let gpu_line = match gpu::gpu(0) {
        Ok(g) => format!("{} ({} SMs)", g.info().name, g.info().multiprocessors),
        Err(e) => format!("no GPU ({e})"),
    };
    writeln!(report, "## Set operations and semi/anti joins: {n} x {n} BIGINT rows, in memory").unwrap();
    writeln!(report, "\nDevice: {gpu_line}; host: {threads} threads; median of {runs} warm runs, cold = first run.\n")
        .unwrap();
    writeln!(report, "| query | result rows | DataFusion warm ms | DataFusion cold ms | setfusion warm ms | setfusion cold ms | speedup (warm) | transfer ms (host packing) | kernel ms | bytes moved |").unwrap();
    writeln!(report, "|---|---|---|---|---|---|---|---|---|---|").unwrap();

    let t = Instant::now();
    let sparse = crate::env::bench_sparse();
    let (key_a, key_b): (fn(u64) -> i64, fn(u64) -> i64) =
        if sparse { (datagen::key_a_sparse, datagen::key_b_sparse) } else { (datagen::key_a, datagen::key_b) };
    let a = Arc::new(datagen::key_table(n, key_a, true, threads)?);
    let b = Arc::new(datagen::key_table(n, key_b, false, threads)?);
    if sparse {
        writeln!(
            report,
            "Keys spread over all 64 bits (`SETFUSION_BENCH_SPARSE=1`): the same matches, no dense domain.\n"
        )
        .unwrap();
    }
    eprintln!("generated 2 x {n} rows in {:.1} s", t.elapsed().as_secs_f64());
    let plain = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(threads));
    let sf = setfusion::context_with_config(SessionConfig::new().with_target_partitions(threads));
    for ctx in [&plain, &sf] {
        ctx.register_table("a", a.clone())?;
        ctx.register_table("b", b.clone())?;
    }
    if let Some(limit) = crate::env::bench_memory_limit() {
        sf.sql(&format!("SET setfusion.memory_limit = '{limit}'")).await?.collect().await?;
        writeln!(report, "setfusion's device budget: `SET setfusion.memory_limit = '{limit}'`.\n").unwrap();
    }
    if let Some(devices) = crate::env::bench_devices() {
        sf.sql(&format!("SET setfusion.devices = '{devices}'")).await?.collect().await?;
        writeln!(report, "setfusion's devices: `SET setfusion.devices = '{devices}'`.\n").unwrap();
    }
    let mut phases = Vec::new();
    // SETFUSION_BENCH_ONLY=IN,payload runs the queries whose names contain one of the words.
    let only: Vec<String> = crate::env::bench_only();
    for (name, sql) in
        datagen::SET_QUERIES.iter().filter(|(n, _)| only.is_empty() || only.iter().any(|w| n.contains(w.as_str())))
    {
        let mut df_runs = Vec::new();
        let mut sf_runs = Vec::new();
        let skip_df = crate::env::bench_skip_datafusion();
        for _ in 0..=runs {
            if !skip_df {
                df_runs.push(run_once(&plain, sql).await?);
            }
            sf_runs.push(run_once(&sf, sql).await?);
        }
        if skip_df {
            // DataFusion skipped: zero times; setfusion's rows stand in for its answer.
            let rows = sf_runs.last().map_or(0, |r| r.rows);
            df_runs = (0..=runs).map(|_| Run { rows, ..Run::default() }).collect();
        }
        let df_cold = df_runs.remove(0).time;
        let sf_cold = sf_runs.remove(0).time;
        let df_warm = median(df_runs.iter().map(|r| r.time).collect());
        let sf_warm = median(sf_runs.iter().map(|r| r.time).collect());
        let last = sf_runs.last().unwrap();
        let agree =
            if df_runs[0].rows == last.rows || name.ends_with("ALL") { "" } else { " (differs from DataFusion!)" };
        let line = format!(
            "| {name} | {}{} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}x | {:.1} ({:.1}) | {:.1} | {:.2} GB |",
            last.rows,
            if name.ends_with("ALL") { format!(" (DataFusion: {})", df_runs[0].rows) } else { agree.to_string() },
            ms(df_warm),
            ms(df_cold),
            ms(sf_warm),
            ms(sf_cold),
            df_warm.as_secs_f64() / sf_warm.as_secs_f64(),
            last.transfer_ns as f64 / 1e6,
            last.staging_ns as f64 / 1e6,
            last.kernel_ns as f64 / 1e6,
            last.bytes as f64 / 1e9
        );
        eprintln!("{line}");
        writeln!(report, "{line}").unwrap();
        phases.push(format!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            ms(last.time),
            last.input_ns as f64 / 1e6,
            last.encode_ns as f64 / 1e6,
            last.select_ns as f64 / 1e6,
            (last.transfer_ns + last.kernel_ns) as f64 / 1e6,
            last.filter_ns as f64 / 1e6,
            ms(last.time) - (last.input_ns + last.encode_ns + last.select_ns + last.filter_ns) as f64 / 1e6
        ));
    }
    writeln!(report, "\nWhere setfusion's time goes (last warm run, ms): waiting for the inputs, key encoding, the selection (of which transfers + kernels), the host filter, and the rest (planning, the aggregate above). \"filter\" is the host time spent cutting kept rows out of the batches (all partitions at once on the copy threads).\n").unwrap();
    writeln!(report, "| query | total | inputs | encode | select | of which transfer + kernel | filter | rest |")
        .unwrap();
    writeln!(report, "|---|---|---|---|---|---|---|---|").unwrap();
    for p in &phases {
        writeln!(report, "{p}").unwrap();
    }
    // One EXPLAIN ANALYZE of IN, for the per-operator times around the GPU step.
    if let Some((_, sql)) = datagen::SET_QUERIES.iter().find(|(n, _)| *n == "IN") {
        let batches = sf.sql(&format!("EXPLAIN ANALYZE {sql}")).await?.collect().await?;
        let text =
            datafusion::arrow::util::pretty::pretty_format_batches(&batches).map(|t| t.to_string()).unwrap_or_default();
        writeln!(report, "\nEXPLAIN ANALYZE of IN (setfusion):\n\n```\n{text}\n```").unwrap();
    }
    drop((a, b, plain, sf));

    if let Ok(g) = gpu::gpu(0) {
        let tile_note;
        writeln!(report, "\n## Device-resident microbenchmarks\n").unwrap();
        writeln!(report, "| kernel | input | median ms | throughput |").unwrap();
        writeln!(report, "|---|---|---|---|").unwrap();
        let _lock = g.lock_blocking();
        // Sorted u32 intersection, a = 2i, b = 3i, 2^28 keys each.
        let m: u32 = crate::env::bench_sorted_log2().unwrap_or(28);
        let len = 1usize << m;
        let av: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2)).collect();
        let bv: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(3)).collect();
        // 2i and 3i wrap past 2^32 for large i: keep strictly increasing prefixes only.
        let av: Vec<u32> = av.windows(2).take_while(|w| w[0] < w[1]).map(|w| w[0]).collect();
        let bv: Vec<u32> = bv.windows(2).take_while(|w| w[0] < w[1]).map(|w| w[0]).collect();
        let mut stats = TransferStats::default();
        let mut si = SortedIntersect::upload(&g, &av, &bv, &mut stats)?;
        let want = setfusion::algo::sorted_intersect::intersect_count_cpu(&av, &bv, None);
        let keys = (av.len() + bv.len()) as f64;
        // Every instantiated tile shape; the report keeps them all.
        let mut shapes = Vec::new();
        use setfusion::algo::sorted_intersect::{TILE_SHAPES, TILE_SHAPES_U32};
        for &shape in TILE_SHAPES.iter().chain(TILE_SHAPES_U32) {
            si = si.with_shape(shape);
            let mut times = Vec::new();
            for _ in 0..10 {
                let mut s = TransferStats::default();
                let got = si.run(&g, None, &mut s)?;
                assert_eq!(got, want, "sorted intersection count");
                times.push(s.kernel);
            }
            shapes.push((shape, median(times)));
        }
        let best = shapes.iter().min_by_key(|(_, t)| *t).copied().unwrap_or(((0, 0), Duration::ZERO));
        let t = best.1;
        writeln!(
            report,
            "| sorted u32 intersection (merge path, tiles {}x{}) | {} x {} keys, {} common | {:.3} | {:.0} G keys/s |",
            best.0 .0,
            best.0 .1,
            av.len(),
            bv.len(),
            want,
            ms(t),
            keys / t.as_secs_f64() / 1e9
        )
        .unwrap();
        let all: Vec<String> = shapes.iter().map(|((nt, vt), t)| format!("{nt}x{vt}: {:.3} ms", ms(*t))).collect();
        eprintln!("sorted intersection by tile shape: {}", all.join(", "));
        tile_note = format!("Sorted intersection by tile shape (threads x steps, median of 10): {}.", all.join(", "));
        drop(si);
        // Hash semi join, 10M x 10M int32 keys (device-resident build and probe).
        let nk = 10_000_000usize;
        let build: Vec<u64> = (0..nk as u64).map(|i| (i * 2654435761) % 20_000_000).collect();
        let probe: Vec<u64> = (0..nk as u64).map(|i| (i * 40503 + 7) % 20_000_000).collect();
        let mut times = Vec::new();
        let resident = select::ResidentSelect::upload(&g, &build, &probe, &mut TransferStats::default())?;
        for s in [GpuStrategy::Hash, GpuStrategy::Bitmap, GpuStrategy::Sort] {
            times.clear();
            for _ in 0..10 {
                let mut st = TransferStats::default();
                resident.run(&g, s, SetOp::Semi, &mut st)?;
                times.push(st.kernel);
            }
            let t = median(times.clone());
            writeln!(
                report,
                "| semi join ({}) | 10M x 10M int32-range keys | {:.3} | {:.1} G probes/s |",
                s.name(),
                ms(t),
                nk as f64 / t.as_secs_f64() / 1e9
            )
            .unwrap();
        }
        writeln!(report, "\n{tile_note}").unwrap();
    }
    println!("{report}");
    if let Some(path) = crate::env::bench_out() {
        std::fs::write(&path, &report).ok();
    }
    Ok(())
}
