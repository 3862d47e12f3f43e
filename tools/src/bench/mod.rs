//! Benchmark programs. Each is run by `cargo bench --bench <name>` (thin
//! wrappers in `benches/`) and by `setfusion bench <name>`, so the release
//! CLI alone can benchmark on a machine without a Rust toolchain.
#[cfg(feature = "ballista")]
pub mod cluster;
pub mod families;
pub mod filter;
pub mod lists;
pub mod parquet;
pub mod seeds;
pub mod setops;
pub mod ssjoin;
pub mod tpch;

/// The median of some timings (the upper one of an even count).
pub(crate) fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// Run this binary with `args` in `runs` fresh processes, each printing
/// `ms=<query time> rows=<n>` (and optionally a `ran=<note>` line); the
/// median time, the rows and the last child's note. A child past `limit` is
/// killed and fails the measurement.
pub(crate) fn fresh_runs(
    args: &[String],
    name: &str,
    runs: usize,
    limit: std::time::Duration,
) -> datafusion::error::Result<(std::time::Duration, usize, String)> {
    use datafusion::error::DataFusionError;
    let exec_err = |m: String| DataFusionError::Execution(m);
    let exe = std::env::current_exe()?;
    let mut times = Vec::new();
    let mut rows = 0;
    let mut note = String::new();
    for _ in 0..runs {
        let child = std::process::Command::new(&exe)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        // A hung child must not stop the whole benchmark: wait for it on a thread, kill it past the limit.
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(limit) {
            Ok(out) => out?,
            Err(_) => {
                let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                return Err(exec_err(format!(
                    "fresh process for {name} did not finish in {} s; killed",
                    limit.as_secs()
                )));
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("ms=")).ok_or_else(|| {
            exec_err(format!("fresh process for {name} failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
        })?;
        let mut parts = line.split_whitespace();
        let t: f64 = parts.next().and_then(|p| p[3..].parse().ok()).unwrap_or(f64::NAN);
        rows = parts.next().and_then(|p| p[5..].parse().ok()).unwrap_or(0);
        note = text.lines().find_map(|l| l.strip_prefix("ran=")).unwrap_or_default().to_string();
        times.push(std::time::Duration::from_secs_f64(t / 1e3));
    }
    Ok((median(times), rows, note))
}
