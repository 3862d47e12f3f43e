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

/// One random table row of the subquery test: x, y (as `s<v>`), k, p; None is NULL.
type SubRow = [Option<i64>; 4];

fn random_sub_table(rng: &mut StdRng, name: &str) -> (String, Vec<SubRow>) {
    let n = match rng.random_range(0..8) {
        0 => 0,
        1 => 1,
        _ => rng.random_range(2..40),
    };
    let domain = rng.random_range(1..6);
    let null_pct = rng.random_range(0..35);
    let rows: Vec<SubRow> = (0..n)
        .map(|_| std::array::from_fn(|_| (rng.random_range(0..100) >= null_pct).then(|| rng.random_range(0..domain))))
        .collect();
    let cols = "x INT, y VARCHAR, k INT, p INT";
    if rows.is_empty() {
        return (format!("CREATE TABLE {name} ({cols})"), rows);
    }
    let lit = |v: Option<i64>, s: bool| match (v, s) {
        (None, true) => "CAST(NULL AS VARCHAR)".to_string(),
        (None, false) => "CAST(NULL AS INT)".to_string(),
        (Some(v), true) => format!("'s{v}'"),
        (Some(v), false) => format!("CAST({v} AS INT)"),
    };
    let values: Vec<String> =
        rows.iter().map(|r| format!("({}, {}, {}, {})", lit(r[0], false), lit(r[1], true), lit(r[2], false), lit(r[3], false))).collect();
    (format!("CREATE TABLE {name} ({cols}) AS VALUES {}", values.join(", ")), rows)
}

/// SQL's three-valued comparisons and connectives.
fn cmp3(a: Option<i64>, b: Option<i64>, f: impl Fn(i64, i64) -> bool) -> Option<bool> {
    Some(f(a?, b?))
}
fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}
fn or3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

/// Correlation predicates of the subquery: SQL text and a brute-force evaluation over (outer, inner).
type Corr = (&'static str, fn(&SubRow, &SubRow) -> Option<bool>);
const CORRELATIONS: &[Corr] = &[
    ("i.x = o.x", |o, i| cmp3(i[0], o[0], |a, b| a == b)),
    ("i.y = o.y", |o, i| cmp3(i[1], o[1], |a, b| a == b)),
    ("i.p > o.p", |o, i| cmp3(i[3], o[3], |a, b| a > b)),
    ("i.p + o.p > 4", |o, i| cmp3(i[3], o[3], |a, b| a + b > 4)),
    ("o.p < 3", |o, _| cmp3(o[3], Some(3), |a, b| a < b)),
    ("i.p < 4", |_, i| cmp3(i[3], Some(4), |a, b| a < b)),
    ("i.y <> o.y", |o, i| cmp3(i[1], o[1], |a, b| a != b)),
];

/// `[NOT] IN` / `[NOT] EXISTS` with random correlation in random boolean
/// contexts (WHERE under OR / NOT / IS NULL, top level, the SELECT list,
/// CASE), answered by setfusion (CPU backend; GPU backend where there is
/// one) and by a brute-force evaluator over nested loops with SQL's
/// three-valued logic. `SETFUSION_MARK_QUERIES` sets the number (default 1000).
#[test]
fn random_subquery_predicates_agree() {
    let queries: usize = std::env::var("SETFUSION_MARK_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let mut rng = StdRng::seed_from_u64(20261124);
        let mut checked = 0;
        while checked < queries {
            let (o_sql, o_rows) = random_sub_table(&mut rng, "o");
            let (i_sql, i_rows) = random_sub_table(&mut rng, "i");
            let stmts = vec![o_sql, i_sql];
            let mut contexts = Vec::new();
            let cpu = setfusion::context();
            setup(&cpu, &stmts, &["SET setfusion.strategy = 'cpu'"]).await;
            contexts.push(("cpu", cpu));
            if gpu {
                let g = setfusion::context();
                setup(&g, &stmts, &["SET setfusion.min_rows = 0"]).await;
                contexts.push(("gpu", g));
            }
            for _ in 0..20 {
                let corr: Vec<&Corr> = CORRELATIONS.iter().filter(|_| rng.random_bool(0.3)).collect();
                let where_sql = if corr.is_empty() { String::new() } else { format!(" WHERE {}", corr.iter().map(|c| c.0).collect::<Vec<_>>().join(" AND ")) };
                let is_in = rng.random_bool(0.6);
                let negated = rng.random_bool(0.5);
                // x or k against i.k (INT), or y against i.y (VARCHAR).
                let probe_col = rng.random_range(0..3);
                let out_col = if probe_col == 1 { 1 } else { 2 };
                let probe_name = ["x", "y", "k", "p"][probe_col];
                let out_name = ["x", "y", "k", "p"][out_col];
                let pred_sql = if is_in {
                    format!("o.{probe_name} {}IN (SELECT i.{out_name} FROM i{where_sql})", if negated { "NOT " } else { "" })
                } else {
                    format!("{}EXISTS (SELECT 1 FROM i{where_sql})", if negated { "NOT " } else { "" })
                };
                // The predicate for one outer row, by the rules.
                let pred = |o: &SubRow| -> Option<bool> {
                    let group: Vec<&SubRow> =
                        i_rows.iter().filter(|i| corr.iter().fold(Some(true), |acc, c| and3(acc, (c.1)(o, i))) == Some(true)).collect();
                    let mark = if is_in {
                        if group.iter().any(|i| cmp3(o[probe_col], i[out_col], |a, b| a == b) == Some(true)) {
                            Some(true)
                        } else if group.is_empty() {
                            Some(false)
                        } else if o[probe_col].is_none() || group.iter().any(|i| i[out_col].is_none()) {
                            None
                        } else {
                            Some(false)
                        }
                    } else {
                        Some(!group.is_empty())
                    };
                    if negated { mark.map(|m| !m) } else { mark }
                };
                let cell = |v: Option<i64>, s: bool| match v {
                    None => "NULL".to_string(),
                    Some(v) if s => format!("s{v}"),
                    Some(v) => v.to_string(),
                };
                let row = |o: &SubRow| vec![cell(o[0], false), cell(o[1], true), cell(o[2], false), cell(o[3], false)];
                let bool_cell = |b: Option<bool>| b.map_or("NULL".to_string(), |b| b.to_string());
                let t = rng.random_range(0..5);
                let context = rng.random_range(0..6);
                let sql = match context {
                    0 => format!("SELECT o.x, o.y, o.k, o.p FROM o WHERE {pred_sql} OR o.p < {t}"),
                    1 => format!("SELECT o.x, o.y, o.k, o.p FROM o WHERE {pred_sql}"),
                    2 => format!("SELECT o.x, o.y, o.k, o.p FROM o WHERE NOT ({pred_sql})"),
                    3 => format!("SELECT o.x, o.y, o.k, o.p FROM o WHERE ({pred_sql}) IS NULL"),
                    4 => format!("SELECT o.x, o.y, o.k, o.p, {pred_sql} FROM o"),
                    _ => format!("SELECT o.x, o.y, o.k, o.p, CASE WHEN {pred_sql} THEN 1 ELSE 0 END FROM o"),
                };
                let mut want: Vec<Row> = Vec::new();
                for o in &o_rows {
                    let m = pred(o);
                    let keep = match context {
                        0 => or3(m, cmp3(o[3], Some(t), |a, b| a < b)) == Some(true),
                        1 => m == Some(true),
                        2 => m == Some(false),
                        3 => m.is_none(),
                        _ => true,
                    };
                    if !keep {
                        continue;
                    }
                    let mut r = row(o);
                    match context {
                        4 => r.push(bool_cell(m)),
                        5 => r.push(if m == Some(true) { "1" } else { "0" }.to_string()),
                        _ => {}
                    }
                    want.push(r);
                }
                want.sort();
                for (name, ctx) in &contexts {
                    let got = collect(ctx, &sql).await;
                    assert_eq!(got, want, "{name} backend: {sql}\n{}", stmts.join(";\n"));
                }
                checked += 1;
            }
        }
        println!("subquery predicates: {checked} random queries agree with the brute-force evaluator (cpu backend{})", if gpu { ", gpu" } else { "" });
    });
}
