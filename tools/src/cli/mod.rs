//! The `setfusion` command line, shaped like datafusion-cli and parsed, as
//! there, with clap: `setfusion --help` and the `--help` of every subcommand
//! describe the options.
//!
//! ```text
//! setfusion [--table NAME=PATH]... [-c "SQL; SQL"]... [-f FILE.sql]... [--format table|csv|json] [--cluster df://HOST:PORT]
//! setfusion demo | doctor | slt FILE.slt... | fuzz | bench NAME | scheduler | executor
//! ```
//! With neither `-c` nor `-f` it reads statements from standard input (a REPL
//! when that is a terminal). Every error is one line on stderr and a non-zero exit.

pub mod demo;
pub mod doctor;

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion::sql::parser::DFParser;

/// Output format of query results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Json,
}

/// setfusion: GPU-accelerated set operators (INTERSECT/EXCEPT [ALL], semi and anti joins, set-similarity joins) for
/// Apache DataFusion.
///
/// Without a subcommand it runs SQL: the statements of every -c, then of every -f, or, with neither, those read from
/// standard input (a REPL when that is a terminal).
#[derive(Debug, Parser)]
#[command(name = "setfusion", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub sql: SqlArgs,
}

/// The options of the SQL mode (no subcommand).
#[derive(Debug, Args)]
pub struct SqlArgs {
    /// Register a Parquet or CSV file, or a folder of them, as table NAME (by extension); repeatable
    #[arg(short = 't', long = "table", value_name = "NAME=PATH", value_parser = parse_table)]
    pub tables: Vec<(String, PathBuf)>,
    /// Run these statements (separated by ';'); repeatable, run in order
    #[arg(short = 'c', long = "command", value_name = "SQL", allow_hyphen_values = true)]
    pub commands: Vec<String>,
    /// Run the statements of this file, after every -c; repeatable
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Output format of query results
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Run the queries on the Ballista cluster whose scheduler listens there (tables' paths are made absolute: the
    /// executors read the files)
    #[arg(long, value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the built-in demonstration: generated data (no download), queries, EXPLAIN, CPU vs GPU timings
    ///
    /// Rows per table: SETFUSION_DEMO_ROWS (default 2,000,000).
    Demo,
    /// Report the GPU, compile every kernel, self-check each against its CPU twin, measure the device's rates
    Doctor(DoctorArgs),
    /// Run sqllogictest files in cpu and gpu modes
    Slt(SltArgs),
    /// Random tables and set-operator queries: every backend against a reference evaluator
    ///
    /// Outer joins inside subqueries are drawn unless SETFUSION_FUZZ_OUTER=0; SETFUSION_FUZZ_TRACE=FILE logs each
    /// query before it runs. A query plain DataFusion also fails on counts as refused.
    Fuzz(crate::fuzz::FuzzArgs),
    /// Benchmarks: DataFusion's CPU plan vs setfusion (see BENCHMARKS.md)
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
    /// A Ballista scheduler with setfusion
    Scheduler(SchedulerArgs),
    /// A Ballista executor with setfusion; plans may read files only under its --data-dir folders
    Executor(ExecutorArgs),
}

/// `setfusion doctor`'s options.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Only start the device as a fresh process does and print the times of its steps (doctor runs itself so to
    /// measure the start)
    #[arg(long)]
    pub start_probe: bool,
}

/// `setfusion slt`'s arguments.
#[derive(Debug, Args)]
pub struct SltArgs {
    /// The sqllogictest files
    #[arg(required = true, value_name = "FILE.slt")]
    pub files: Vec<PathBuf>,
}

/// The benchmarks. Environment knobs (SETFUSION_BENCH_ROWS, SETFUSION_BENCH_RUNS, SETFUSION_BENCH_OUT, ...) are
/// named in each benchmark's --help.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// The set-operation benchmark: DataFusion's CPU plan vs setfusion on 2 x N BIGINT rows in memory
    ///
    /// Environment: SETFUSION_BENCH_ROWS (N, default 100,000,000), SETFUSION_BENCH_RUNS (warm runs, default 3),
    /// SETFUSION_BENCH_ONLY=a,b (only the queries whose names contain one of these), SETFUSION_BENCH_OUT (file for
    /// the markdown table), SETFUSION_BENCH_MEMORY_LIMIT=160M, SETFUSION_BENCH_DEVICES=0,1,
    /// SETFUSION_BENCH_SKIP_DATAFUSION=1, SETFUSION_BENCH_SPARSE=1, SETFUSION_BENCH_SORTED_LOG2.
    Setops,
    /// The host's floor for cutting kept rows out of 100M x 2 BIGINT columns
    ///
    /// Environment: SETFUSION_BENCH_ROWS (default 100,000,000), SETFUSION_BENCH_RUNS (default 5).
    Filter,
    /// TPC-H over Parquet (generated and cached): DataFusion vs setfusion, fresh process and warm
    ///
    /// The data lands in SETFUSION_TPCH_DIR (default ~/.cache/setfusion/tpch).
    Tpch(crate::bench::tpch::Options),
    /// Issue 27's queries over Parquet: DataFusion, setfusion fresh / warm / device-cached, DuckDB when installed
    ///
    /// Environment: SETFUSION_BENCH_ROWS (rows per table, default 100,000,000), SETFUSION_BENCH_RUNS (default for
    /// --runs), SETFUSION_PARQUET_DIR (the Parquet cache, default ~/.cache/setfusion/parquet).
    Parquet(crate::bench::parquet::Options),
    /// Intersection of two families of sets, GPU vs CPU backend
    Families(crate::bench::families::Options),
    /// List functions vs array_intersect, k-way posting-list intersection, GPU vs CPU
    ///
    /// The markdown table is also written to SETFUSION_BENCH_OUT when set.
    Lists(crate::bench::lists::Options),
    /// The similarity-join benchmark: GPU vs CPU backend
    ///
    /// Environment: SSJOIN_BENCH_OUT (default for --out), SSJOIN_BENCH_NLJ_SETS (sets of the nested-loop
    /// reference, default 4,000), SETFUSION_DATA_DIR (where dblp_t_18k.txt is).
    Ssjoin(crate::bench::ssjoin::Options),
    /// The seed documents' benchmark cases on setfusion's code paths, one markdown table per seed
    ///
    /// Each row: the case, the paper's figure and hardware, setfusion's figure here, the ratio, and whether the
    /// answers match the baselines'. --quick runs small sizes in well under a minute (CI runs it).
    Seeds(crate::bench::seeds::Options),
    /// setfusion on a Ballista cluster on loopback ports (in this process, or --processes): answers checked
    /// against one process, and timed
    #[cfg(feature = "ballista")]
    Cluster(crate::bench::cluster::Options),
}

/// `setfusion scheduler`'s options.
#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Port to listen on
    #[arg(long, default_value_t = 50050)]
    pub port: u16,
    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub bind: String,
}

/// `setfusion executor`'s options.
#[derive(Debug, Args)]
pub struct ExecutorArgs {
    /// The scheduler to register with
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050", value_parser = parse_host_port)]
    pub scheduler: (String, u16),
    /// Port of its Arrow Flight service (shuffle data)
    #[arg(long, default_value_t = 50051)]
    pub port: u16,
    /// Port of its gRPC service [default: --port + 1]
    #[arg(long)]
    pub grpc_port: Option<u16>,
    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub bind: String,
    /// Tasks run at once [default: the host's cores]
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub tasks: Option<usize>,
    /// A folder whose files plans may read; repeatable [default: the current folder]
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dirs: Vec<PathBuf>,
    /// Folder for shuffle files and spills [default: a temporary folder]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Its GPUs for sessions that name none (setfusion.devices), e.g. 0,1
    #[arg(long, value_name = "DEVICES", value_parser = parse_devices)]
    pub devices: Option<setfusion::config::Devices>,
}

/// `NAME=PATH` of `--table`.
fn parse_table(spec: &str) -> std::result::Result<(String, PathBuf), String> {
    match spec.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok((name.to_string(), PathBuf::from(path))),
        _ => Err("expected NAME=PATH".into()),
    }
}

/// `HOST:PORT` of `--scheduler`.
fn parse_host_port(s: &str) -> std::result::Result<(String, u16), String> {
    let (host, port) = s.rsplit_once(':').ok_or("expected HOST:PORT")?;
    let port = port.parse().map_err(|_| format!("'{port}' is not a port"))?;
    Ok((host.to_string(), port))
}

/// A count of at least one.
fn parse_positive(s: &str) -> std::result::Result<usize, String> {
    s.parse().ok().filter(|&n| n > 0).ok_or_else(|| "expected a positive number".to_string())
}

fn parse_devices(s: &str) -> std::result::Result<setfusion::config::Devices, String> {
    s.parse().map_err(|e: DataFusionError| e.message().into_owned())
}

pub use setfusion::util::one_line;

/// The `setfusion` binary's `main`: the command line of this process run on
/// a multi-threaded runtime, then the process exits with its code. It lives
/// here, not in the binary, so the binary instantiates no async code of its
/// own and its build is little more than a link (it took a minute or more of
/// a first build on two cores).
pub fn main() -> ! {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("setfusion: cannot start the async runtime: {e}");
            setfusion::gpu::exit_process(1)
        }
    };
    let code = runtime.block_on(main_with_args(std::env::args().collect()));
    // The process ends here, the runtime still up (as under #[tokio::main]):
    // its drop would wait for blocking tasks the exit makes moot.
    setfusion::gpu::exit_process(code)
}

/// Entry point; returns the process exit code.
pub async fn main_with_args(args: Vec<String>) -> i32 {
    setfusion::util::trace("process: command line read");
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return report_parse_error(&e, &args),
    };
    match run(cli).await {
        Ok(code) => code,
        // The reader went away (`setfusion -c ... | head`): stop quietly, as `cat` does.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            1
        }
    }
}

/// Help and version go to standard output with status 0 (a closed pipe is no
/// error there either); a missing subcommand prints the help to stderr; any
/// other parse error is one line on stderr. Both with status 1.
fn report_parse_error(e: &clap::Error, args: &[String]) -> i32 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            1
        }
        _ => {
            eprintln!("Error: {}", parse_error_line(e, args));
            1
        }
    }
}

/// Clap's error as one line: its message and tips (without the usage block),
/// then where to read more, e.g. `(see setfusion bench tpch --help)`.
pub fn parse_error_line(e: &clap::Error, args: &[String]) -> String {
    let text = e.render().to_string();
    let mut parts = Vec::new();
    let mut command = subcommand_path(args);
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(usage) = line.strip_prefix("Usage:") {
            // The usage line starts with the command's path: `setfusion bench tpch [OPTIONS]`.
            let path: Vec<&str> =
                usage.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-', '.', '|'])).collect();
            if !path.is_empty() {
                command = path.join(" ");
            }
        } else if !line.starts_with("For more information") {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    format!("{} (see {command} --help)", parts.join("; "))
}

/// The subcommands named at the start of a command line: `setfusion bench tpch`
/// for `setfusion bench tpch --sf x` (an error without a usage line says no more).
fn subcommand_path(args: &[String]) -> String {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut path = vec!["setfusion".to_string()];
    for arg in args.iter().skip(1) {
        let Some(sub) = command.find_subcommand(arg).cloned() else { break };
        path.push(arg.clone());
        command = sub;
    }
    path.join(" ")
}

async fn run(cli: Cli) -> Result<i32> {
    let Some(command) = cli.command else { return run_sql_mode(cli.sql).await };
    match command {
        Command::Demo => demo::run().await.map(|_| 0),
        Command::Doctor(DoctorArgs { start_probe: true }) => Ok(doctor::start_probe()),
        Command::Doctor(DoctorArgs { start_probe: false }) => doctor::run().await,
        Command::Slt(SltArgs { files }) => {
            Ok(crate::slt::run_cli(&files, &[crate::slt::Mode::Cpu, crate::slt::Mode::Gpu]).await)
        }
        Command::Fuzz(options) => crate::fuzz::cli(options).await,
        Command::Bench { bench } => run_bench(bench).await.map(|_| 0),
        Command::Scheduler(options) => run_scheduler(options).await,
        Command::Executor(options) => run_executor(options).await,
    }
}

async fn run_bench(bench: Bench) -> Result<()> {
    match bench {
        Bench::Setops => crate::bench::setops::run().await,
        Bench::Filter => crate::bench::filter::run(),
        Bench::Tpch(options) => crate::bench::tpch::run(options).await,
        Bench::Parquet(options) => crate::bench::parquet::run(options).await,
        Bench::Families(options) => crate::bench::families::run(options).await,
        Bench::Lists(options) => crate::bench::lists::run(options).await,
        // It drives its own runtime: run it on a plain thread.
        Bench::Ssjoin(options) => std::thread::spawn(move || crate::bench::ssjoin::run(options))
            .join()
            .map_err(|_| DataFusionError::Execution("ssjoin benchmark panicked".into())),
        // It starts runtimes of its own (SQL cases): run it on a plain thread.
        Bench::Seeds(options) => std::thread::spawn(move || crate::bench::seeds::run(options))
            .join()
            .map_err(|_| DataFusionError::Execution("seeds benchmark panicked".into()))?,
        #[cfg(feature = "ballista")]
        Bench::Cluster(options) => crate::bench::cluster::run(options).await,
    }
}

/// The SQL mode: register the tables, then run every `-c`, then every `-f` (or the REPL with neither).
async fn run_sql_mode(args: SqlArgs) -> Result<i32> {
    let SqlArgs { tables, commands, files, format, cluster } = args;
    let ctx = match &cluster {
        None => setfusion::context(),
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
        setfusion::util::trace("statement: parsed");
        let plan = ctx.state().statement_to_plan(stmt).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let mut batches = df.collect().await?;
        setfusion::util::trace("statement: collected");
        if batches.is_empty() && !schema.fields().is_empty() {
            batches.push(RecordBatch::new_empty(schema));
        }
        print_batches(&mut std::io::stdout().lock(), &batches, format)?;
    }
    Ok(())
}

pub fn print_batches(out: &mut dyn Write, batches: &[RecordBatch], format: Format) -> Result<()> {
    match format {
        Format::Table => {
            if batches.iter().any(|b| b.num_columns() > 0) {
                writeln!(out, "{}", pretty_format_batches(batches)?)?;
            }
        }
        Format::Csv => {
            let mut w = datafusion::arrow::csv::Writer::new(out);
            for b in batches {
                w.write(&nested_as_text(b)?)?;
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

/// `batch` with its nested columns (lists, structs, maps) as text, printed
/// as the table format prints them: Arrow's CSV writer takes no nested type.
fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Array, ArrayRef, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    if !batch.schema().fields().iter().any(|f| f.data_type().is_nested()) {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if f.data_type().is_nested() {
            let text = ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default())?;
            let values: StringArray = (0..c.len()).map(|i| c.is_valid(i).then(|| text.value(i).to_string())).collect();
            fields.push(Field::new(f.name(), DataType::Utf8, f.is_nullable()));
            columns.push(Arc::new(values));
        } else {
            fields.push(f.as_ref().clone());
            columns.push(c.clone());
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
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
    let url = setfusion_ballista::process::cluster_url(url)?;
    setfusion_ballista::remote_context(&url, datafusion::prelude::SessionConfig::new()).await
}

#[cfg(not(feature = "ballista"))]
async fn cluster_context(_url: &str) -> Result<SessionContext> {
    Err(DataFusionError::Configuration("--cluster: this setfusion was built without the `ballista` feature".into()))
}

/// Run a Ballista scheduler until the process ends.
#[cfg(feature = "ballista")]
async fn run_scheduler(options: SchedulerArgs) -> Result<i32> {
    setfusion_ballista::process::run_scheduler(&options.bind, options.port).await?;
    Ok(0)
}

/// Run a Ballista executor until the process ends.
#[cfg(feature = "ballista")]
async fn run_executor(options: ExecutorArgs) -> Result<i32> {
    use setfusion_ballista::process::ExecutorOptions;
    let ExecutorArgs {
        scheduler: (scheduler_host, scheduler_port),
        port,
        grpc_port,
        bind,
        tasks,
        data_dirs,
        work_dir,
        devices,
    } = options;
    let data_dirs = if data_dirs.is_empty() { vec![std::env::current_dir()?] } else { data_dirs };
    setfusion_ballista::process::run_executor(ExecutorOptions {
        bind,
        port,
        grpc_port: grpc_port.unwrap_or(port.wrapping_add(1)),
        scheduler_host,
        scheduler_port,
        concurrent_tasks: tasks.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        data_dirs,
        work_dir,
        devices,
    })
    .await?;
    Ok(0)
}

#[cfg(not(feature = "ballista"))]
async fn run_scheduler(_options: SchedulerArgs) -> Result<i32> {
    Err(DataFusionError::Configuration("scheduler: this setfusion was built without the `ballista` feature".into()))
}

#[cfg(not(feature = "ballista"))]
async fn run_executor(_options: ExecutorArgs) -> Result<i32> {
    Err(DataFusionError::Configuration("executor: this setfusion was built without the `ballista` feature".into()))
}
