//! The `setfusion` command line, shaped like datafusion-cli.
//!
//! ```text
//! setfusion [--table NAME=PATH]... [-c "SQL; SQL"]... [-f FILE.sql]... [--format table|csv|json]
//! setfusion demo | doctor | slt FILE.slt...
//! ```
//! With neither `-c` nor `-f` it reads statements from standard input (a REPL
//! when that is a terminal). Every error is one line on stderr and a non-zero exit.

pub mod demo;
pub mod doctor;

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion::sql::parser::DFParser;

/// Output format of query results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

const USAGE: &str = "usage: setfusion [--table NAME=PATH]... [-c SQL]... [-f FILE]... [--format table|csv|json]
       setfusion demo      run the built-in demonstration (generated data, no download)
       setfusion doctor    report the GPU, compile every kernel, self-check each against its CPU twin
       setfusion slt FILE.slt...   run sqllogictest files in cpu and gpu modes
       setfusion fuzz [--queries N] [--seed S] [--max-rows N] [--cpu-only]
                              random tables and set-operator queries: every backend against a reference evaluator
       setfusion bench setops      the set-operation benchmark (DataFusion CPU plan vs setfusion)
       setfusion bench filter      the host's floor for cutting kept rows out of 100M x 2 BIGINT columns
       setfusion bench ssjoin [--quick] [--reps N] [--no-nlj] [--out FILE] [--collections dblp,uniform,zipf]
                              [--sets N,..] [--thresholds T,..] [--cpu-timeout-s S] [--no-cpu]   the similarity-join benchmark
       setfusion bench families [--sizes K,..] [--kinds uniform,similar] [--cpu-max K] [--runs N]
                                   intersection of two families of sets, GPU vs CPU backend
       setfusion bench lists [--rows N] [--batch-rows N] [--max-len N] [--queries N] [--terms N] [--max-list N] [--skip-rows] [--skip-kway]
                                   list functions vs array_intersect, k-way posting-list intersection, GPU vs CPU
       setfusion bench parquet [--runs N] [--codecs snappy,zstd] [--no-fresh]   issue 27's queries over Parquet (SETFUSION_BENCH_ROWS rows)
       setfusion bench tpch [--sf N] [--runs N] [--queries q4,q16,..] [--out FILE.md] [--svg FILE.svg]
                              TPC-H over Parquet (generated and cached): DataFusion vs setfusion, fresh process and warm
       setfusion scheduler [--port P] [--bind ADDR]   a Ballista scheduler with setfusion (default 127.0.0.1:50050)
       setfusion executor [--scheduler HOST:P] [--port Q] [--grpc-port R] [--bind ADDR] [--tasks N]
                          [--data-dir DIR]... [--work-dir DIR] [--devices 0,1]
                              a Ballista executor with setfusion; plans may read files only under its --data-dir folders
                              (default: the current folder); --devices: its GPUs for sessions that name none
       setfusion --cluster df://HOST:P [--table NAME=PATH]... [-c SQL]...   run the queries on that cluster";

pub use crate::util::one_line;

/// Entry point; returns the process exit code.
pub async fn main_with_args(args: Vec<String>) -> i32 {
    match run(args).await {
        Ok(code) => code,
        // The reader went away (`setfusion -c ... | head`): stop quietly, as `cat` does.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            1
        }
    }
}

async fn run(args: Vec<String>) -> Result<i32> {
    let mut tables = Vec::new();
    let mut commands: Vec<String> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut format = Format::Table;
    let mut cluster: Option<String> = None;
    let mut it = args.into_iter().skip(1).peekable();
    let usage_err = |m: &str| DataFusionError::Configuration(format!("{m} (see setfusion --help)"));
    while let Some(a) = it.next() {
        match a.as_str() {
            "demo" if tables.is_empty() && commands.is_empty() => return demo::run().await.map(|_| 0),
            "doctor" if tables.is_empty() && commands.is_empty() => {
                if it.peek().is_some_and(|a| a == "--start-probe") {
                    return Ok(doctor::start_probe());
                }
                return doctor::run().await;
            }
            "slt" => {
                let paths: Vec<PathBuf> = it.by_ref().map(PathBuf::from).collect();
                if paths.is_empty() {
                    return Err(usage_err("slt needs at least one .slt file"));
                }
                return Ok(crate::slt::run_cli(&paths, &[crate::slt::Mode::Cpu, crate::slt::Mode::Gpu]).await);
            }
            "fuzz" if tables.is_empty() && commands.is_empty() => return crate::fuzz::cli(it.collect()).await,
            "bench" if tables.is_empty() && commands.is_empty() => {
                return match it.next().as_deref() {
                    Some("setops") => crate::bench::setops::run().await.map(|_| 0),
                    Some("filter") => crate::bench::filter::run().map(|_| 0),
                    Some("tpch") => crate::bench::tpch::run(it.collect()).await.map(|_| 0),
                    Some("parquet") => crate::bench::parquet::run(it.collect()).await.map(|_| 0),
                    Some("families") => crate::bench::families::run(it.collect()).await.map(|_| 0),
                    Some("lists") => crate::bench::lists::run(it.collect()).await.map(|_| 0),
                    Some("ssjoin") => {
                        // It drives its own runtime: run it on a plain thread.
                        let rest: Vec<String> = it.collect();
                        std::thread::spawn(move || crate::bench::ssjoin::run(rest))
                            .join()
                            .map(|_| 0)
                            .map_err(|_| DataFusionError::Execution("ssjoin benchmark panicked".into()))
                    }
                    other => Err(usage_err(&format!(
                        "bench {other:?}: expected setops, filter, ssjoin, tpch, parquet, families or lists"
                    ))),
                };
            }
            "scheduler" if tables.is_empty() && commands.is_empty() => {
                return cluster_process(Process::Scheduler, it.collect()).await
            }
            "executor" if tables.is_empty() && commands.is_empty() => {
                return cluster_process(Process::Executor, it.collect()).await
            }
            "--cluster" => cluster = Some(it.next().ok_or_else(|| usage_err("--cluster needs df://HOST:PORT"))?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(0);
            }
            "--table" | "-t" => {
                let spec = it.next().ok_or_else(|| usage_err("--table needs NAME=PATH"))?;
                let (name, path) =
                    spec.split_once('=').ok_or_else(|| usage_err(&format!("--table '{spec}': expected NAME=PATH")))?;
                tables.push((name.to_string(), PathBuf::from(path)));
            }
            "-c" | "--command" => commands.push(it.next().ok_or_else(|| usage_err("-c needs SQL"))?),
            "-f" | "--file" => files.push(PathBuf::from(it.next().ok_or_else(|| usage_err("-f needs a file"))?)),
            "--format" => {
                format = match it.next().as_deref() {
                    Some("table") => Format::Table,
                    Some("csv") => Format::Csv,
                    Some("json") => Format::Json,
                    other => return Err(usage_err(&format!("--format {other:?}: expected table, csv or json"))),
                }
            }
            other => return Err(usage_err(&format!("unknown argument '{other}'"))),
        }
    }
    let ctx = match &cluster {
        None => crate::context(),
        Some(url) => cluster_context(url).await?,
    };
    for (name, path) in &tables {
        // A cluster's executors read the files: they need the whole path.
        let path = if cluster.is_some() { absolute(path)? } else { path.clone() };
        register_table(&ctx, name, &path).await?;
    }
    if commands.is_empty() && files.is_empty() {
        return repl(&ctx, format).await;
    }
    for c in &commands {
        run_sql(&ctx, c, format).await?;
    }
    for f in &files {
        let sql = std::fs::read_to_string(f)
            .map_err(|e| DataFusionError::Execution(format!("cannot read {}: {e}", f.display())))?;
        run_sql(&ctx, &sql, format).await?;
    }
    Ok(0)
}

/// Register a Parquet or CSV file (or a folder of them) as a table, by extension.
pub async fn register_table(ctx: &SessionContext, name: &str, path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path)
        .map_err(|e| DataFusionError::Execution(format!("table {name}: cannot open {}: {e}", path.display())))?;
    let ext_of = |p: &Path| p.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase());
    let ext = if meta.is_dir() {
        std::fs::read_dir(path)
            .map_err(|e| DataFusionError::Execution(format!("table {name}: {e}")))?
            .filter_map(|e| e.ok().and_then(|e| ext_of(&e.path())))
            .find(|e| e == "parquet" || e == "csv")
    } else {
        ext_of(path)
    };
    let p = path.to_string_lossy();
    match ext.as_deref() {
        Some("parquet") => ctx.register_parquet(name, p.as_ref(), ParquetReadOptions::default()).await,
        Some("csv") => ctx.register_csv(name, p.as_ref(), CsvReadOptions::new()).await,
        _ => Err(DataFusionError::Execution(format!(
            "table {name}: {} is neither .parquet nor .csv (nor a folder of them)",
            path.display()
        ))),
    }
}

/// Whether an error is a write to a closed pipe (EPIPE), however it was wrapped.
pub fn is_broken_pipe(e: &DataFusionError) -> bool {
    use datafusion::arrow::error::ArrowError;
    let io = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    let boxed =
        |e: &(dyn std::error::Error + Send + Sync + 'static)| e.downcast_ref::<std::io::Error>().is_some_and(io);
    match e {
        DataFusionError::IoError(e) => io(e),
        DataFusionError::ArrowError(a, _) => match a.as_ref() {
            ArrowError::IoError(_, e) => io(e),
            ArrowError::ExternalError(x) => boxed(x.as_ref()),
            // The CSV writer keeps only the message of its io::Error.
            ArrowError::CsvError(m) => {
                m.contains(&std::io::Error::from(std::io::ErrorKind::BrokenPipe).to_string())
                    || m.contains("os error 32")
            }
            _ => false,
        },
        DataFusionError::External(x) => boxed(x.as_ref()),
        DataFusionError::Context(_, inner) => is_broken_pipe(inner),
        DataFusionError::Shared(inner) => is_broken_pipe(inner),
        _ => false,
    }
}

/// Run every statement of `sql` in order, printing each result.
pub async fn run_sql(ctx: &SessionContext, sql: &str, format: Format) -> Result<()> {
    let state = ctx.state();
    let dialect_name = state.config().options().sql_parser.dialect.to_string();
    let dialect = datafusion::sql::sqlparser::dialect::dialect_from_str(&dialect_name)
        .ok_or_else(|| DataFusionError::Configuration(format!("unknown SQL dialect {dialect_name}")))?;
    let statements = DFParser::parse_sql_with_dialect(sql, dialect.as_ref())?;
    for stmt in statements {
        let plan = ctx.state().statement_to_plan(stmt).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let mut batches = df.collect().await?;
        if batches.is_empty() && !schema.fields().is_empty() {
            batches.push(RecordBatch::new_empty(schema));
        }
        print_batches(&mut std::io::stdout().lock(), &batches, format)?;
    }
    Ok(())
}

fn print_batches(out: &mut dyn Write, batches: &[RecordBatch], format: Format) -> Result<()> {
    match format {
        Format::Table => {
            if batches.iter().any(|b| b.num_columns() > 0) {
                writeln!(out, "{}", pretty_format_batches(batches)?)?;
            }
        }
        Format::Csv => {
            let mut w = datafusion::arrow::csv::Writer::new(out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(())
}

/// Read statements (terminated by `;`) from stdin; errors are reported and reading goes on.
async fn repl(ctx: &SessionContext, format: Format) -> Result<i32> {
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        println!(
            "setfusion {} — {}. End statements with ';', quit with \\q.",
            env!("CARGO_PKG_VERSION"),
            doctor::gpu_line()
        );
    }
    let mut buf = String::new();
    let mut failed = false;
    let stdin = std::io::stdin();
    loop {
        if interactive {
            print!("{}", if buf.is_empty() { "setfusion> " } else { "       -> " });
            std::io::stdout().flush().ok();
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        if buf.is_empty() && matches!(line.trim(), "\\q" | "quit" | "exit") {
            break;
        }
        buf.push_str(&line);
        if buf.trim_end().ends_with(';') {
            if !run_statement(ctx, &buf, format, &mut failed).await {
                return Ok(0);
            }
            buf.clear();
        }
    }
    if !buf.trim().is_empty() && !run_statement(ctx, &buf, format, &mut failed).await {
        return Ok(0);
    }
    Ok(if failed && !interactive { 1 } else { 0 })
}

/// One statement of the REPL or a piped script: an error is printed and
/// remembered in `failed`; false when the output pipe closed (stop quietly).
async fn run_statement(ctx: &SessionContext, sql: &str, format: Format, failed: &mut bool) -> bool {
    match run_sql(ctx, sql, format).await {
        Err(e) if is_broken_pipe(&e) => false,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            *failed = true;
            true
        }
        Ok(()) => true,
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| DataFusionError::Execution(format!("cannot open {}: {e}", path.display())))
}

/// A client session on the Ballista cluster at `url` (`df://HOST:PORT`).
#[cfg(feature = "ballista")]
async fn cluster_context(url: &str) -> Result<SessionContext> {
    let url = crate::distributed::process::cluster_url(url)?;
    crate::distributed::remote_context(&url, datafusion::prelude::SessionConfig::new()).await
}

#[cfg(not(feature = "ballista"))]
async fn cluster_context(_url: &str) -> Result<SessionContext> {
    Err(DataFusionError::Configuration("--cluster: this setfusion was built without the `ballista` feature".into()))
}

/// Which cluster process `setfusion scheduler` / `setfusion executor` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    Scheduler,
    Executor,
}

/// Parse a cluster process's options and run it until the process ends.
#[cfg(feature = "ballista")]
async fn cluster_process(process: Process, args: Vec<String>) -> Result<i32> {
    use crate::distributed::process::{run_executor, run_scheduler, ExecutorOptions};
    let usage_err = |m: String| DataFusionError::Configuration(format!("{m} (see setfusion --help)"));
    let mut bind = "127.0.0.1".to_string();
    let mut port: Option<u16> = None;
    let mut grpc_port: Option<u16> = None;
    let mut scheduler = "127.0.0.1:50050".to_string();
    let mut tasks = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut data_dirs: Vec<PathBuf> = Vec::new();
    let mut work_dir: Option<PathBuf> = None;
    let mut devices = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| usage_err(format!("{a} needs a value")));
        let port_of = |v: String| v.parse::<u16>().map_err(|_| usage_err(format!("{a} '{v}': not a port")));
        match (process, a.as_str()) {
            (_, "-h" | "--help") => {
                println!("{USAGE}");
                return Ok(0);
            }
            (_, "--bind") => bind = value()?,
            (_, "--port") => port = Some(port_of(value()?)?),
            (Process::Executor, "--grpc-port") => grpc_port = Some(port_of(value()?)?),
            (Process::Executor, "--scheduler") => scheduler = value()?,
            (Process::Executor, "--tasks") => {
                let v = value()?;
                tasks = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| usage_err(format!("--tasks '{v}': expected a positive number")))?;
            }
            (Process::Executor, "--data-dir") => data_dirs.push(PathBuf::from(value()?)),
            (Process::Executor, "--work-dir") => work_dir = Some(PathBuf::from(value()?)),
            (Process::Executor, "--devices") => devices = Some(value()?.parse::<crate::config::Devices>()?),
            _ => return Err(usage_err(format!("unknown argument '{a}'"))),
        }
    }
    match process {
        Process::Scheduler => run_scheduler(&bind, port.unwrap_or(50050)).await?,
        Process::Executor => {
            let (host, sport) = scheduler
                .rsplit_once(':')
                .ok_or_else(|| usage_err(format!("--scheduler '{scheduler}': expected HOST:PORT")))?;
            let scheduler_port =
                sport.parse().map_err(|_| usage_err(format!("--scheduler '{scheduler}': '{sport}' is not a port")))?;
            let port = port.unwrap_or(50051);
            if data_dirs.is_empty() {
                data_dirs.push(std::env::current_dir()?);
            }
            run_executor(ExecutorOptions {
                bind,
                port,
                grpc_port: grpc_port.unwrap_or(port.wrapping_add(1)),
                scheduler_host: host.to_string(),
                scheduler_port,
                concurrent_tasks: tasks,
                data_dirs,
                work_dir,
                devices,
            })
            .await?
        }
    }
    Ok(0)
}

#[cfg(not(feature = "ballista"))]
async fn cluster_process(process: Process, _args: Vec<String>) -> Result<i32> {
    Err(DataFusionError::Configuration(format!("{process:?}: this setfusion was built without the `ballista` feature")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    /// A reader that went away: every write fails with EPIPE.
    struct ClosedPipe;
    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_closed_pipe_is_recognised_in_every_format() {
        let batch = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
        for format in [Format::Table, Format::Csv, Format::Json] {
            let e = print_batches(&mut ClosedPipe, std::slice::from_ref(&batch), format).expect_err("writes fail");
            assert!(is_broken_pipe(&e), "{format:?}: {e}");
        }
        assert!(!is_broken_pipe(&DataFusionError::Plan("x".into())));
        assert!(!is_broken_pipe(&DataFusionError::IoError(std::io::ErrorKind::NotFound.into())));
    }
}
