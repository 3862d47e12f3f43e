//! Host filter floor: how fast can the kept rows of 100M x 2 BIGINT columns
//! (16 partitions of 65536-row batches, 25% kept, one thread per partition)
//! be cut out on this host? Arrow's filter on both columns, on the payload
//! only (what is left when the key column comes back from the device), and a
//! plain read of both columns. The set-operation benchmark's payload query
//! spends this step after its selection.
//!
//! ```text
//! setfusion bench filter        # SETFUSION_BENCH_ROWS (default 1e8), SETFUSION_BENCH_RUNS (5)
//! ```

use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::{filter, filter_record_batch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::error::Result;

use super::median;
use crate::datagen;

pub fn run() -> Result<()> {
    let n: u64 = crate::env::bench_rows().unwrap_or(100_000_000);
    let runs: usize = crate::env::bench_runs().unwrap_or(5);
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let table = datagen::key_table(n, datagen::key_a, true, threads)?;
    let parts: Vec<Vec<RecordBatch>> = futures::executor::block_on(async {
        use datafusion::datasource::TableProvider;
        let ctx = datafusion::prelude::SessionContext::new();
        let plan = table.scan(&ctx.state(), None, &[], None).await?;
        datafusion::physical_plan::collect_partitioned(plan, ctx.task_ctx()).await
    })?;
    // 25% of rows kept, spread like the benchmark's IN (hash of the row).
    let masks: Vec<Vec<BooleanArray>> = parts
        .iter()
        .map(|p| {
            p.iter()
                .map(|b| {
                    let k = b.column(0).as_primitive::<Int64Type>();
                    BooleanArray::from_iter(
                        k.values().iter().map(|&x| Some((x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 62 == 0)),
                    )
                })
                .collect()
        })
        .collect();
    let kept: usize = masks.iter().flatten().map(|m| m.true_count()).sum();
    println!("host filter experiment: {n} rows x 2 BIGINT, {} partitions, {kept} kept; median of {runs}", parts.len());
    type Variant = fn(&RecordBatch, &BooleanArray) -> usize;
    let variants: [(&str, Variant); 3] = [
        ("arrow filter_record_batch (k, v)", |b, m| filter_record_batch(b, m).map_or(0, |r| r.num_rows())),
        ("arrow filter (v only)", |b, m| filter(b.column(1), m).map_or(0, |r| r.len())),
        ("read k, v (sum)", |b, _| {
            let k = b.column(0).as_primitive::<Int64Type>().values();
            let v = b.column(1).as_primitive::<Int64Type>().values();
            k.iter().zip(v.iter()).fold(0i64, |s, (a, b)| s.wrapping_add(*a ^ *b)) as usize & 1
        }),
    ];
    for (name, f) in variants {
        let mut times = Vec::new();
        let mut sums = Vec::new();
        for _ in 0..=runs {
            let t = Instant::now();
            let (out, busy): (Vec<usize>, Vec<Duration>) = std::thread::scope(|s| {
                let hs: Vec<_> = parts
                    .iter()
                    .zip(&masks)
                    .map(|(p, m)| {
                        s.spawn(move || {
                            let t = Instant::now();
                            let r = p.iter().zip(m).map(|(b, m)| f(b, m)).sum::<usize>();
                            (r, t.elapsed())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).unzip()
            });
            times.push(t.elapsed());
            sums.push((out.iter().sum::<usize>(), busy.iter().sum::<Duration>()));
        }
        times.remove(0);
        let (rows, busy) = sums.last().copied().unwrap_or_default();
        println!(
            "| {name} | wall {:.1} ms | summed {:.1} ms | {rows} |",
            median(times.clone()).as_secs_f64() * 1e3,
            busy.as_secs_f64() * 1e3
        );
    }
    // Groups of 8 batches into one output buffer (as SetSelectExec does): a fresh
    // allocation per group, against buffers kept from the previous run (no page faults).
    let groups: Vec<Vec<(usize, usize)>> =
        parts.iter().map(|p| (0..p.len()).step_by(8).map(|g| (g, (g + 8).min(p.len()))).collect()).collect();
    let mut reuse: Vec<Vec<Vec<i64>>> = groups.iter().map(|g| g.iter().map(|_| Vec::new()).collect()).collect();
    for fresh in [true, false] {
        let mut times = Vec::new();
        for _ in 0..=runs {
            let t = Instant::now();
            std::thread::scope(|s| {
                for (((p, m), g), bufs) in parts.iter().zip(&masks).zip(&groups).zip(reuse.iter_mut()) {
                    s.spawn(move || {
                        for (&(lo, hi), buf) in g.iter().zip(bufs.iter_mut()) {
                            let kept: usize = m[lo..hi].iter().map(|m| m.true_count()).sum();
                            if fresh {
                                *buf = Vec::with_capacity(kept);
                            } else {
                                buf.clear();
                                buf.reserve(kept);
                            }
                            for i in lo..hi {
                                let v = p[i].column(1).as_primitive::<Int64Type>().values();
                                setfusion::exec::output_filter::for_each_kept(
                                    v,
                                    (m[i].values().values(), m[i].values().offset()),
                                    |x| buf.push(x),
                                );
                            }
                        }
                    });
                }
            });
            times.push(t.elapsed());
            if fresh {
                reuse.iter_mut().flatten().for_each(|b| *b = Vec::new());
            }
        }
        times.remove(0);
        let name = if fresh {
            "groups of 8 batches (v only), fresh buffers"
        } else {
            "groups of 8 batches (v only), reused buffers"
        };
        println!("| {name} | wall {:.1} ms |", median(times).as_secs_f64() * 1e3);
    }
    Ok(())
}
