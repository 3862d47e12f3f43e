//! setfusion on a Ballista cluster in one process: a scheduler and two
//! executors on loopback ports (no Docker, no network), small Parquet tables,
//! and the set operations, IN / NOT IN and a similarity join run through the
//! cluster, each answer checked against one process and timed.
//!
//! ```text
//! cargo run --release --example ballista_cluster [-- ROWS [RUNS [processes [EXECUTORS]]]]
//! ```
//!
//! ROWS (default 20000) rows per key table; RUNS (default 1) runs of each
//! query on each side, of which the median time is printed. With `processes`
//! the scheduler and EXECUTORS (default 2) executors are separate processes
//! started from the `setfusion` binary beside this example's
//! (`target/release/setfusion`, or `SETFUSION_BIN`), as a user starts them.

use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion_ballista::{demo, remote_context, start_loopback_cluster};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut number = |what: &str, default: usize| -> Result<usize> {
        match args.next() {
            None => Ok(default),
            Some(a) => {
                a.parse().map_err(|_| DataFusionError::Configuration(format!("{what}: expected a number, got '{a}'")))
            }
        }
    };
    let rows = number("ROWS", 20_000)?;
    let runs = number("RUNS", 1)?.max(1);
    let processes = args.next().is_some_and(|a| a == "processes");
    let executors = match args.next() {
        None => 2,
        Some(a) => {
            a.parse().map_err(|_| DataFusionError::Configuration(format!("EXECUTORS: expected a number, got '{a}'")))?
        }
    };

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
    let bin = match std::env::var_os("SETFUSION_BIN") {
        Some(b) => std::path::PathBuf::from(b),
        None => {
            std::env::current_exe()?.parent().and_then(|d| d.parent()).map(|d| d.join("setfusion")).unwrap_or_default()
        }
    };
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
