//! `setfusion demo`: generated data, representative queries, EXPLAIN showing
//! where each operator ran, and DataFusion's CPU plan vs setfusion timings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;

use crate::datagen;

/// Rows per generated table (override with SETFUSION_DEMO_ROWS).
const DEFAULT_ROWS: u64 = 2_000_000;

/// Timed runs of each query on each side (after a warm-up run).
const RUNS: usize = 3;

/// What a GPU gives: `setfusion bench setops` on one H100, 100,000,000 rows a
/// side, warm medians of 5 (BENCHMARKS.md, section 1, "Final run", commit
/// 4d89427): (query, DataFusion ms, setfusion ms, speedup as published there,
/// from the unrounded times).
pub const H100_SETOPS: &[(&str, f64, f64, f64)] = &[
    ("INTERSECT", 2641.3, 52.3, 50.5),
    ("EXCEPT", 2836.6, 54.2, 52.3),
    ("INTERSECT ALL", 1441.1, 44.0, 32.8),
    ("EXCEPT ALL", 1669.6, 50.2, 33.2),
    ("IN", 1393.5, 50.2, 27.8),
    ("NOT IN", 1578.2, 47.0, 33.5),
    ("EXISTS", 1422.3, 43.7, 32.5),
    ("IN, rows + payload", 1337.3, 54.0, 24.8),
];

/// Some timed runs of one query.
#[derive(Debug, Clone)]
pub struct Timings(pub Vec<Duration>);

impl Timings {
    fn median(&self) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[v.len() / 2]
    }
    fn min(&self) -> Duration {
        self.0.iter().copied().min().unwrap_or_default()
    }
    fn max(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

/// The speedup column: a ratio only where the two sides ran different plans
/// and their run times do not overlap; otherwise the difference is noise.
pub fn speedup_cell(datafusion: &Timings, setfusion: &Timings, same_plan: bool) -> String {
    if same_plan {
        return "same plan".into();
    }
    if datafusion.min() <= setfusion.max() && setfusion.min() <= datafusion.max() {
        return "noise".into();
    }
    format!("{:.1}x", datafusion.median().as_secs_f64() / setfusion.median().as_secs_f64().max(1e-9))
}

/// The lines of a physical plan that do work: setfusion's pass-through
/// `SetfusionDeclinedExec` (which only says why it kept DataFusion's operator)
/// left out, each line trimmed of its indentation.
pub fn working_plan(plan_text: &str) -> Vec<String> {
    plan_text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("SetfusionDeclinedExec"))
        .map(str::to_string)
        .collect()
}

async fn physical_plan_text(ctx: &SessionContext, sql: &str) -> Result<String> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
    Ok(text)
}

async fn timed_runs(ctx: &SessionContext, sql: &str) -> Result<Timings> {
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        times.push(rows_of(ctx, sql).await?.2);
    }
    Ok(Timings(times))
}

async fn rows_of(ctx: &SessionContext, sql: &str) -> Result<(usize, String, Duration)> {
    let t = Instant::now();
    let batches = ctx.sql(sql).await?.collect().await?;
    let elapsed = t.elapsed();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    // A count(*) query shows its value; a row query shows its row count.
    let shown = if rows == 1 && batches[0].num_columns() == 1 {
        datafusion::arrow::util::display::array_value_to_string(batches[0].column(0), 0)?
    } else {
        format!("{rows} rows")
    };
    Ok((rows, shown, elapsed))
}

/// The setfusion operators of a query's physical plan, one per line.
async fn explain_lines(ctx: &SessionContext, sql: &str) -> Result<Vec<String>> {
    let batches = ctx.sql(&format!("EXPLAIN {sql}")).await?.collect().await?;
    let text = pretty_format_batches(&batches)?.to_string();
    Ok(text
        .lines()
        .filter(|l| {
            ["SetfusionDeclinedExec", "SemiJoinExec", "SetOpExec", "MarkJoinExec", "HashJoinExec", "SimilarityJoinExec"]
                .iter()
                .any(|op| l.contains(op))
        })
        .map(|l| l.trim_matches(|c| c == '|' || c == ' ').trim().to_string())
        .collect())
}

pub async fn run() -> Result<()> {
    let n: u64 = crate::env::demo_rows().unwrap_or(DEFAULT_ROWS);
    println!("setfusion demo — {}", super::doctor::gpu_line());

    // 1. Exactness: SQL multiset semantics that DataFusion 55 gets wrong.
    let small = "CREATE TABLE x(v INT) AS VALUES (3),(3),(3),(1),(NULL),(NULL); CREATE TABLE y(v INT) AS VALUES (3),(1),(1),(NULL)";
    let plain = SessionContext::new();
    let sf = setfusion::context();
    for ctx in [&plain, &sf] {
        for stmt in small.split(';') {
            ctx.sql(stmt).await?.collect().await?;
        }
    }
    println!("\n== Exact multiset semantics (x = {{3,3,3,1,NULL,NULL}}, y = {{3,1,1,NULL}}) ==");
    for (name, sql) in [
        ("INTERSECT ALL", "SELECT v FROM x INTERSECT ALL SELECT v FROM y ORDER BY v"),
        ("EXCEPT ALL", "SELECT v FROM x EXCEPT ALL SELECT v FROM y ORDER BY v"),
        // SQL: 1 NOT IN {3, NULL} is NULL, not TRUE; DataFusion's mark join says TRUE.
        (
            "NOT IN .. OR",
            "SELECT v FROM x WHERE v NOT IN (SELECT v FROM y WHERE v IS NULL OR v > 1) OR v IS NULL ORDER BY v",
        ),
        // DataFusion refuses a subquery predicate in a SELECT list.
        ("IN in SELECT", "SELECT v IN (SELECT v FROM y WHERE v > 1) FROM x ORDER BY v"),
    ] {
        let show = |b: Vec<datafusion::arrow::record_batch::RecordBatch>| -> Result<String> {
            let mut vals = Vec::new();
            for batch in &b {
                for i in 0..batch.num_rows() {
                    vals.push(datafusion::arrow::util::display::array_value_to_string(batch.column(0), i)?);
                }
            }
            Ok(format!(
                "{{{}}}",
                vals.iter()
                    .map(|v| if v.is_empty() { "NULL".to_string() } else { v.clone() })
                    .collect::<Vec<_>>()
                    .join(",")
            ))
        };
        let df_ans = match async { plain.sql(sql).await?.collect().await }.await {
            Ok(b) => show(b)?,
            Err(e) => format!("error: {}", setfusion::util::one_line(&e).chars().take(40).collect::<String>()),
        };
        let sf_ans = show(sf.sql(sql).await?.collect().await?)?;
        println!("{name:14} DataFusion: {df_ans:22} setfusion: {sf_ans}");
    }

    // 2. Speed: the benchmark's tables at demo size.
    println!("\n== Set operations on a, b = {n} BIGINT rows each (generated) ==");
    let parts = std::thread::available_parallelism().map_or(4, |p| p.get());
    let a = Arc::new(datagen::key_table(n, datagen::key_a, true, parts)?);
    let b = Arc::new(datagen::key_table(n, datagen::key_b, false, parts)?);
    for ctx in [&plain, &sf] {
        ctx.register_table("a", a.clone())?;
        ctx.register_table("b", b.clone())?;
    }
    println!(
        "{:20} {:>14} {:>12} {:>12} {:>10}  where (median of {RUNS} warm runs each)",
        "query", "result", "DataFusion", "setfusion", "speedup"
    );
    let mut same_plans = 0;
    for (name, sql) in datagen::SET_QUERIES {
        let (_, df_res, _) = rows_of(&plain, sql).await?; // warm-up (and the reference answer)
        let df_t = timed_runs(&plain, sql).await?;
        let (_, sf_res, _) = rows_of(&sf, sql).await?;
        let sf_t = timed_runs(&sf, sql).await?;
        let note = if df_res == sf_res || name.ends_with("ALL") { "" } else { "  (results differ!)" };
        let same_plan =
            working_plan(&physical_plan_text(&plain, sql).await?) == working_plan(&physical_plan_text(&sf, sql).await?);
        same_plans += usize::from(same_plan);
        let ops = explain_lines(&sf, sql).await?;
        let shown = if name.ends_with("ALL") { format!("{sf_res} (DF: {df_res})") } else { sf_res };
        let place = if same_plan {
            "DataFusion's own plan on both sides".to_string()
        } else {
            ops.first().cloned().unwrap_or_else(|| "DataFusion plan".into())
        };
        println!(
            "{name:20} {shown:>14} {:>10.1}ms {:>10.1}ms {:>10}  {place}{note}",
            df_t.median().as_secs_f64() * 1e3,
            sf_t.median().as_secs_f64() * 1e3,
            speedup_cell(&df_t, &sf_t, same_plan),
        );
    }
    println!(
        "\n(\"same plan\": setfusion kept DataFusion's plan, so the times differ by noise only; \"noise\": the runs' \
         times overlap. `EXPLAIN ANALYZE <query>` in `setfusion` shows bytes moved, transfer and kernel time)"
    );
    if setfusion::gpu::gpu(0).is_err() {
        print_gpu_figures(same_plans);
    }
    families(&sf).await
}

/// Without a GPU: what one gives, from the benchmark's H100 run.
fn print_gpu_figures(same_plans: usize) {
    println!(
        "\nNo GPU here: {same_plans} of {} queries ran DataFusion's own plan, the others setfusion's CPU backend. \
         What a GPU gives, `setfusion bench setops` on one H100 with 100,000,000 rows a side (BENCHMARKS.md, \
         section 1, warm medians of 5):",
        datagen::SET_QUERIES.len()
    );
    println!("{:20} {:>12} {:>12} {:>10}", "query", "DataFusion", "setfusion", "speedup");
    for (name, datafusion_ms, setfusion_ms, speedup) in H100_SETOPS {
        println!("{name:20} {datafusion_ms:>10.1}ms {setfusion_ms:>10.1}ms {speedup:>9.1}x");
    }
}

/// 3. Set-valued data: the paper's figure 1 (seed 000) through `intersect_families`.
async fn families(ctx: &SessionContext) -> Result<()> {
    println!("\n== Intersection of two families of sets (Fort et al., figure 1) ==");
    for stmt in [
        "CREATE TABLE demo_f(id INT, elements INT[]) AS VALUES (0, [3, 0, 1, 2]), (1, [5, 1]), (2, [2, 0, 3]), (3, [3, 4]), (4, [1, 3, 2, 5]), (5, [1])",
        "CREATE TABLE demo_g(id INT, elements INT[]) AS VALUES (0, [1, 4]), (1, [1, 5, 4]), (2, [4, 0, 2, 3]), (3, [5, 3, 4])",
    ] {
        ctx.sql(stmt).await?.collect().await?;
    }
    let sql = "SELECT * FROM intersect_families('demo_f', 'demo_g')";
    println!("{sql}");
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut line = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            let set = datafusion::arrow::util::display::array_value_to_string(b.column(0), i)?;
            let freq = datafusion::arrow::util::display::array_value_to_string(b.column(1), i)?;
            line.push(format!("{set}x{freq}"));
        }
    }
    println!("  {} distinct sets: {}", line.len(), line.join(" "));
    Ok(())
}
