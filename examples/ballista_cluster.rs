//! setfusion on a Ballista cluster in one process: a scheduler and two
//! executors on loopback ports (no Docker, no network), small Parquet tables,
//! and the set operations, IN / NOT IN and a similarity join run through the
//! cluster, each answer checked against one process and timed.
//!
//! ```text
//! cargo run --release --example ballista_cluster [-- ROWS [RUNS]]
//! ```
//!
//! ROWS (default 20000) rows per key table; RUNS (default 1) runs of each
//! query on each side, of which the median time is printed.

use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion::distributed::{demo, remote_context, start_loopback_cluster};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut number = |what: &str, default: usize| -> Result<usize> {
        match args.next() {
            None => Ok(default),
            Some(a) => a.parse().map_err(|_| DataFusionError::Configuration(format!("{what}: expected a number, got '{a}'"))),
        }
    };
    let rows = number("ROWS", 20_000)?;
    let runs = number("RUNS", 1)?.max(1);

    let dir = std::env::temp_dir().join(format!("setfusion-ballista-cluster-{}", std::process::id()));
    demo::write_tables(&dir, rows).await?;

    // Two executors with two task slots each, and the scheduler, on loopback ports.
    let url = start_loopback_cluster(2, 2).await?;
    println!("scheduler at {url}, two executors; tables of {rows} rows under {}", dir.display());
    let config = || SessionConfig::new().with_target_partitions(4);
    let cluster = remote_context(&url, config()).await?;
    demo::register_tables(&cluster, &dir).await?;
    let local = setfusion::context_with_config(config());
    demo::register_tables(&local, &dir).await?;

    println!("{:<16} {:>8} {:>12} {:>12}  agrees", "query", "rows", "cluster ms", "local ms");
    let mut all_agree = true;
    for (name, sql) in demo::QUERIES {
        let (distributed, cluster_time) = timed(&cluster, sql, runs).await?;
        let (single, local_time) = timed(&local, sql, runs).await?;
        let agrees = distributed == single;
        all_agree &= agrees;
        println!(
            "{name:<16} {:>8} {:>12.1} {:>12.1}  {}",
            distributed.len(),
            cluster_time.as_secs_f64() * 1e3,
            local_time.as_secs_f64() * 1e3,
            if agrees { "yes" } else { "NO" }
        );
        for row in distributed.iter().take(3) {
            println!("    {row}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !all_agree {
        return Err(DataFusionError::Execution("the cluster's answers differ from one process's".into()));
    }
    Ok(())
}

/// The query's sorted answer and the median time of `runs` runs.
async fn timed(ctx: &SessionContext, sql: &str, runs: usize) -> Result<(Vec<String>, Duration)> {
    let mut times = Vec::new();
    let mut rows = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        rows = demo::sorted_rows(ctx, sql).await?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok((rows, times[times.len() / 2]))
}
