//! Randomized differential test: random tables with NULLs and duplicates,
//! random set operations and semi/anti joins, answered by
//! * setfusion's CPU backend (`setfusion.strategy = 'cpu'`),
//! * setfusion's GPU backend (every strategy; skipped without a GPU),
//! * and an oracle: DataFusion's own plan for semi/anti joins and distinct set
//!   operations (where DataFusion is right), exact multiset counting in Rust
//!   for INTERSECT ALL / EXCEPT ALL (where DataFusion 55 is wrong).
//!
//! `SETFUSION_DIFF_QUERIES` sets the number of queries (default 1000).

use std::collections::HashMap;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{block_on, gpu_or_skip};

type Row = Vec<String>;

fn rows_of(batches: &[RecordBatch]) -> Vec<Row> {
    let mut rows = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| if c.is_null(i) { "NULL".to_string() } else { array_value_to_string(c, i).unwrap() })
                    .collect(),
            );
        }
    }
    rows.sort();
    rows
}

/// Column types of the random tables: (SQL type, value generator over a small domain).
const TYPES: &[&str] = &["BIGINT", "INT", "SMALLINT", "VARCHAR", "BOOLEAN", "DATE", "DECIMAL(10,2)", "DECIMAL(30,3)"];

fn literal(ty: &str, v: u32) -> String {
    match ty {
        "VARCHAR" => format!("'s{v}'"),
        "BOOLEAN" => (v % 2 == 0).to_string(),
        "DATE" => format!("DATE '2024-01-{:02}'", 1 + v % 28),
        "DECIMAL(10,2)" | "DECIMAL(30,3)" => format!("{}.{}", v, v % 7),
        _ => v.to_string(),
    }
}

/// CREATE TABLE statement for a random table with `cols` columns of `types`.
fn random_table(rng: &mut StdRng, name: &str, types: &[&str]) -> String {
    let n = match rng.random_range(0..10) {
        0 => 0,
        1 => 1,
        _ => rng.random_range(2..60),
    };
    let domain = rng.random_range(1..12);
    let cols: Vec<String> = types.iter().enumerate().map(|(i, t)| format!("c{i} {t}")).collect();
    if n == 0 {
        return format!("CREATE TABLE {name} ({})", cols.join(", "));
    }
    let null_pct = rng.random_range(0..30);
    let rows: Vec<String> = (0..n)
        .map(|_| {
            let vals: Vec<String> = types
                .iter()
                .map(|t| {
                    if rng.random_range(0..100) < null_pct {
                        format!("CAST(NULL AS {t})")
                    } else {
                        format!("CAST({} AS {t})", literal(t, rng.random_range(0..domain)))
                    }
                })
                .collect();
            format!("({})", vals.join(", "))
        })
        .collect();
    format!("CREATE TABLE {name} ({}) AS VALUES {}", cols.join(", "), rows.join(", "))
}

/// Exact SQL multiset semantics over rows (NULLs equal, as in set operations).
fn oracle_set_op(op: &str, a: &[Row], b: &[Row]) -> Vec<Row> {
    let mut nb: HashMap<&Row, usize> = HashMap::new();
    for r in b {
        *nb.entry(r).or_default() += 1;
    }
    let mut ma: HashMap<&Row, usize> = HashMap::new();
    for r in a {
        *ma.entry(r).or_default() += 1;
    }
    let mut out = Vec::new();
    for (r, &m) in &ma {
        let n = nb.get(r).copied().unwrap_or(0);
        let copies = match op {
            "INTERSECT ALL" => m.min(n),
            "EXCEPT ALL" => m.saturating_sub(n),
            "INTERSECT" => (n > 0) as usize,
            "EXCEPT" => (n == 0) as usize,
            _ => unreachable!(),
        };
        out.extend(std::iter::repeat_n((*r).clone(), copies));
    }
    out.sort();
    out
}

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<Row> {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows_of(&df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}")))
}

async fn setup(ctx: &SessionContext, stmts: &[String], settings: &[&str]) {
    for s in settings.iter().map(|s| s.to_string()).chain(stmts.iter().cloned()) {
        ctx.sql(&s).await.unwrap_or_else(|e| panic!("{s}: {e}")).collect().await.unwrap();
    }
}

#[test]
fn random_queries_agree() {
    let queries: usize = std::env::var("SETFUSION_DIFF_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let mut rng = StdRng::seed_from_u64(20261122);
        let mut checked = 0;
        let mut round = 0;
        while checked < queries {
            round += 1;
            // A fresh pair of tables every round: 1-3 columns of random types.
            let ncols = rng.random_range(1..=3);
            let types: Vec<&str> = (0..ncols).map(|_| TYPES[rng.random_range(0..TYPES.len())]).collect();
            let stmts = vec![random_table(&mut rng, "a", &types), random_table(&mut rng, "b", &types)];
            let plain = SessionContext::new();
            setup(&plain, &stmts, &[]).await;
            let cpu = setfusion::context();
            setup(&cpu, &stmts, &["SET setfusion.strategy = 'cpu'"]).await;
            let mut gpus = Vec::new();
            if gpu {
                for strategy in ["auto", "hash", "bitmap", "sort"] {
                    let g = setfusion::context();
                    let set = format!("SET setfusion.strategy = '{strategy}'");
                    setup(&g, &stmts, &["SET setfusion.min_rows = 0", &set]).await;
                    gpus.push((strategy, g));
                }
            }
            let cols: Vec<String> = (0..ncols).map(|i| format!("c{i}")).collect();
            let all = cols.join(", ");
            let a_rows = collect(&plain, &format!("SELECT {all} FROM a")).await;
            let b_rows = collect(&plain, &format!("SELECT {all} FROM b")).await;
            for _ in 0..20 {
                let k = rng.random_range(0..ncols);
                let (sql, oracle) = match rng.random_range(0..8) {
                    op @ 0..=3 => {
                        let op = ["INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"][op];
                        (format!("SELECT {all} FROM a {op} SELECT {all} FROM b"), Some(oracle_set_op(op, &a_rows, &b_rows)))
                    }
                    4 => (format!("SELECT {all} FROM a WHERE c{k} IN (SELECT c{k} FROM b)"), None),
                    5 => (format!("SELECT {all} FROM a WHERE c{k} NOT IN (SELECT c{k} FROM b)"), None),
                    6 => (format!("SELECT {all} FROM a WHERE EXISTS (SELECT 1 FROM b WHERE {})", cols.iter().map(|c| format!("b.{c} = a.{c}")).collect::<Vec<_>>().join(" AND ")), None),
                    _ => (format!("SELECT {all} FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.c{k} = a.c{k})"), None),
                };
                let want = match oracle {
                    Some(o) => o,
                    None => collect(&plain, &sql).await,
                };
                let got = collect(&cpu, &sql).await;
                assert_eq!(got, want, "round {round}, cpu backend: {sql}\n{}", stmts.join(";\n"));
                for (strategy, g) in &gpus {
                    let got = collect(g, &sql).await;
                    assert_eq!(got, want, "round {round}, gpu backend ({strategy}): {sql}\n{}", stmts.join(";\n"));
                }
                checked += 1;
            }
        }
        println!("differential: {checked} random queries agree (cpu backend{})", if gpu { ", gpu auto/hash/bitmap/sort" } else { "" });
    });
}
