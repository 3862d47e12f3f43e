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
    let sf = crate::context();
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
            Err(e) => format!("error: {}", crate::util::one_line(&e).chars().take(40).collect::<String>()),
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
    println!("{:20} {:>14} {:>12} {:>12} {:>9}  where", "query", "result", "DataFusion", "setfusion", "speedup");
    for (name, sql) in datagen::SET_QUERIES {
        let (_, df_res, _) = rows_of(&plain, sql).await?; // warm-up (and the reference answer)
        let (_, _, df_t) = rows_of(&plain, sql).await?;
        let (_, sf_res, _) = rows_of(&sf, sql).await?;
        let (_, _, sf_t) = rows_of(&sf, sql).await?;
        let note = if df_res == sf_res || name.ends_with("ALL") { "" } else { "  (results differ!)" };
        let ops = explain_lines(&sf, sql).await?;
        let shown = if name.ends_with("ALL") { format!("{sf_res} (DF: {df_res})") } else { sf_res };
        println!(
            "{name:20} {shown:>14} {:>10.1}ms {:>10.1}ms {:>8.1}x  {}{note}",
            df_t.as_secs_f64() * 1e3,
            sf_t.as_secs_f64() * 1e3,
            df_t.as_secs_f64() / sf_t.as_secs_f64().max(1e-9),
            ops.first().cloned().unwrap_or_else(|| "DataFusion plan".into())
        );
    }
    println!("\n(warm runs; `EXPLAIN ANALYZE <query>` in `setfusion` shows bytes moved, transfer and kernel time)");
    families(&sf).await
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
