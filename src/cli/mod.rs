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
                              TPC-H over Parquet (generated and cached): DataFusion vs setfusion, fresh process and warm";

pub use crate::util::one_line;

/// Entry point; returns the process exit code.
pub async fn main_with_args(args: Vec<String>) -> i32 {
    match run(args).await {
        Ok(code) => code,
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
                    other => Err(usage_err(&format!("bench {other:?}: expected setops, filter, ssjoin, tpch, parquet, families or lists"))),
                };
            }
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
    let ctx = crate::context();
    for (name, path) in &tables {
        register_table(&ctx, name, path).await?;
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
        print_batches(&batches, format)?;
    }
    Ok(())
}

fn print_batches(batches: &[RecordBatch], format: Format) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Table => {
            if batches.iter().any(|b| b.num_columns() > 0) {
                writeln!(out, "{}", pretty_format_batches(batches)?)?;
            }
        }
        Format::Csv => {
            let mut w = datafusion::arrow::csv::Writer::new(&mut out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
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
        println!("setfusion {} — {}. End statements with ';', quit with \\q.", env!("CARGO_PKG_VERSION"), doctor::gpu_line());
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
            if let Err(e) = run_sql(ctx, &buf, format).await {
                eprintln!("Error: {}", one_line(&e));
                failed = true;
            }
            buf.clear();
        }
    }
    if !buf.trim().is_empty() {
        if let Err(e) = run_sql(ctx, &buf, format).await {
            eprintln!("Error: {}", one_line(&e));
            failed = true;
        }
    }
    Ok(if failed && !interactive { 1 } else { 0 })
}
