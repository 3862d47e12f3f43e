//! `setfusion bench cluster`: setfusion on a Ballista cluster. A scheduler and
//! executors on loopback ports (no Docker, no network), in this process or,
//! with `--processes`, as separate `setfusion scheduler` / `setfusion
//! executor` processes started from this binary as a user starts them; small
//! Parquet tables; the set operations, IN / NOT IN and a similarity join run
//! through the cluster, each answer checked against one process and timed.
//! (It was `ballista/examples/ballista_cluster.rs`, a binary of its own that
//! every `cargo test` built.)

use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion_ballista::{demo, remote_context, start_loopback_cluster};

/// `setfusion bench cluster`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Rows per key table
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub rows: usize,
    /// Runs of each query on each side (the median is printed); 0 counts as 1
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub runs: usize,
    /// The scheduler and the executors as separate processes of this binary
    #[arg(long)]
    pub processes: bool,
    /// Executors (two task slots each)
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub executors: usize,
    /// Only the queries whose names contain one of these (comma-separated)
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub queries: Vec<String>,
}

/// Queries timed beside the demo's: a mark join whose answer is a few
/// counts, so that large tables time the join, not the client's printing.
const COUNTED: &[(&str, &str)] = &[(
    "in under or, counted",
    "SELECT count(*), count(m), count(CASE WHEN m THEN 1 END) \
     FROM (SELECT k, v, k IN (SELECT k FROM t) OR v > 990 AS m FROM r)",
)];

/// Run the benchmark; an error when an answer differs from one process's.
pub async fn run(options: Options) -> Result<()> {
    let Options { rows, runs, processes, executors, queries } = options;
    let runs = runs.max(1);
    let dir = std::env::temp_dir().join(format!("setfusion-ballista-cluster-{}", std::process::id()));
    demo::write_tables(&dir, rows).await?;

    // The scheduler and the executors (two task slots each) on loopback ports.
    let mut children = Children(Vec::new());
    let url = if processes {
        start_processes(&dir, executors, &mut children)?
    } else {
        start_loopback_cluster(executors, 2).await?
    };
    let how = if processes { "separate processes" } else { "in this process" };
    println!("scheduler at {url}, {executors} executors ({how}); tables of {rows} rows under {}", dir.display());
    let config = || SessionConfig::new().with_target_partitions(4);
    let cluster = remote_context(&url, config()).await?;
    demo::register_tables(&cluster, &dir).await?;
    let local = setfusion::context_with_config(config());
    demo::register_tables(&local, &dir).await?;

    println!("{:<24} {:>8} {:>12} {:>12}  agrees", "query", "rows", "cluster ms", "local ms");
    let mut all_agree = true;
    let chosen = demo::QUERIES
        .iter()
        .chain(COUNTED)
        .filter(|(name, _)| queries.is_empty() || queries.iter().any(|q| name.contains(q.as_str())));
    for (name, sql) in chosen {
        let (distributed, cluster_time) = timed(&cluster, sql, runs).await?;
        let (single, local_time) = timed(&local, sql, runs).await?;
        let agrees = distributed == single;
        all_agree &= agrees;
        println!(
            "{name:<24} {:>8} {:>12.1} {:>12.1}  {}",
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

/// Child processes, killed on drop.
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `setfusion scheduler` and `executors` `setfusion executor` processes on
/// free loopback ports, reading files under `data`; returns the cluster's URL.
fn start_processes(data: &std::path::Path, executors: usize, children: &mut Children) -> Result<String> {
    let bin = std::env::current_exe()?;
    let start = |args: Vec<String>| {
        std::process::Command::new(&bin)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| DataFusionError::Execution(format!("starting {} {args:?}: {e}", bin.display())))
    };
    let ports = setfusion_ballista::process::free_ports(1 + 2 * executors)?;
    children.0.push(start(vec!["scheduler".into(), "--port".into(), ports[0].to_string()])?);
    setfusion_ballista::process::wait_for_port(ports[0], "the scheduler", Duration::from_secs(60), &mut children.0)?;
    let scheduler = format!("127.0.0.1:{}", ports[0]);
    for e in 0..executors {
        let (flight, grpc) = (ports[1 + 2 * e], ports[2 + 2 * e]);
        let args = [
            "executor",
            "--scheduler",
            &scheduler,
            "--port",
            &flight.to_string(),
            "--grpc-port",
            &grpc.to_string(),
            "--tasks",
            "2",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.extend(["--data-dir".to_string(), data.display().to_string()]);
        children.0.push(start(args)?);
        setfusion_ballista::process::wait_for_port(flight, "an executor", Duration::from_secs(60), &mut children.0)?;
    }
    Ok(format!("df://{scheduler}"))
}
