//! `setfusion fuzz [--queries N] [--seed S] [--max-rows N]`: a randomized
//! differential run over every setfusion set operator (issue 16 item 7).
//!
//! Each round draws two tables `a` and `b` with the same 1-3 columns of
//! random key types (NULLs, duplicates, empty sides, sizes from 0 to
//! `--max-rows`), then 20 random queries:
//! * INTERSECT / EXCEPT [ALL] on every column;
//! * IN / NOT IN / EXISTS / NOT EXISTS at the top of a WHERE clause;
//! * the same predicates, correlated on another column, with or without a
//!   residual `<>` filter, in a boolean context DataFusion cannot answer
//!   (under OR, under NOT, IS NULL, in the SELECT list, in CASE);
//! * quantified comparisons `a.c op ANY / SOME / ALL (subquery)` (op one of
//!   = <> < <= > >=) in the same shapes and contexts;
//! * subqueries whose FROM is a LEFT / RIGHT / FULL join of the correlated
//!   rows of `b` with `b` (y's columns renamed or sharing x's names), the
//!   correlation on the preserved or the NULL-supplying side (off with
//!   `SETFUSION_FUZZ_OUTER=0`).
//!
//! One round in three draws instead a table of list pairs for 20 random
//! list-function queries (`set_intersect_all`, `set_except_all`,
//! `set_union_all`, `set_symmetric_difference`, `sorted_intersect` over
//! `array_sort`, `set_intersect_agg` by group; sometimes on UInt32 lists),
//! checked against a count-based reference, or two random families of sets
//! for 10 `intersect_families` queries (every level, and the self form),
//! checked against a pairwise loop, or two random list tables for 10
//! similarity joins (`jaccard`, `dice`, `set_cosine`, `overlap` against
//! exact fractions and the metrics' ends, strict or not, either operand
//! order, sometimes under a cast or over the sets as strings, with an
//! equality key or another condition),
//! checked against the metrics' definitions. Those tables are built in Rust and
//! registered as batches; they run on the CPU backend, default settings and,
//! with a GPU, `min_rows = 0` under auto and hash.
//!
//! One round in three, of every kind, reads its tables from Parquet files
//! written for it (1-3 files a table, row groups and pages of 1 row to 1M,
//! statistics of strings truncated or not, bloom filters or not, with or
//! without `parquet.pushdown_filters`, 1-4 target partitions, rows sorted
//! by the first column and the files declared so or not): the scans
//! then prune with the dynamic filters setfusion's operators publish, and
//! similarity joins and families read their inputs by row ranges.
//!
//! Every query runs on the CPU backend (`strategy = cpu`), with default
//! settings (the cost model's choices), on the CPU backend with
//! `hash_partition_inputs` (as on a cluster: partitioned set operations,
//! broadcast mark joins; set-operator rounds only) and, where a GPU is usable, on the GPU
//! backend under each strategy (auto, hash, bitmap, sort); each answer is compared with a reference evaluator written here
//! from SQL's rules (hash counting over the rows DataFusion read back from
//! the tables, three-valued logic). A mismatch is returned as the seed,
//! round, query, and the statements that build the tables. An error is a
//! mismatch too, unless plain DataFusion also fails on the query: such a
//! query is counted as refused, and the first is printed with setfusion's
//! error. (DataFusion's decorrelation fails on a top-level EXISTS / IN over
//! a correlated derived table joined with another that reads the same table
//! under new names; setfusion now takes those as mark joins.)

use std::collections::HashMap;
use std::fmt::Write as _;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One row as the canonical strings of its values (None: NULL). Equal
/// strings are equal SQL values for every type drawn here (no floats).
type Row = Vec<Option<String>>;

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct FuzzOptions {
    pub queries: usize,
    pub seed: u64,
    /// Largest table drawn (about one table in ten is large).
    pub max_rows: usize,
    /// Also run the GPU backends (when a GPU is usable).
    pub gpu: bool,
}

impl Default for FuzzOptions {
    fn default() -> Self {
        Self { queries: 1000, seed: 1, max_rows: 200_000, gpu: true }
    }
}

/// What a run checked.
#[derive(Debug, Clone, Default)]
pub struct FuzzReport {
    pub queries: usize,
    pub rounds: usize,
    pub backends: Vec<String>,
    pub largest_table: usize,
    /// Queries that failed with an error on setfusion and on plain DataFusion alike.
    pub refused: usize,
    /// The first refused query and setfusion's error on it.
    pub first_refused: Option<String>,
}

/// Key types of the random tables.
const TYPES: &[&str] = &[
    "BIGINT",
    "INT",
    "SMALLINT",
    "TINYINT",
    "BIGINT UNSIGNED",
    "VARCHAR",
    "BYTEA",
    "BOOLEAN",
    "DATE",
    "TIMESTAMP",
    "DECIMAL(10,2)",
    "DECIMAL(30,3)",
    "DECIMAL(50,5)",
    "DOUBLE",
    "REAL",
];

fn is_float(ty: &str) -> bool {
    matches!(ty, "DOUBLE" | "REAL")
}

/// A float column's SQL value for `v`: -0.0 (equal to 0.0), 'NaN' and the
/// NaN with the sign bit (distinct from it, as in DataFusion), infinity, or
/// a number with a fraction.
fn float_literal(ty: &str, v: u64) -> String {
    match v % 11 {
        0 => "-0.0".to_string(),
        1 => format!("CAST('NaN' AS {ty})"),
        2 => format!("-CAST('NaN' AS {ty})"),
        3 => format!("CAST('inf' AS {ty})"),
        // Odd ones negative.
        _ => format!("{}{}.25", sign(v), v / 11),
    }
}

/// Half the integers, decimals and floats drawn are negative (odd draws), and
/// half the unsigned ones 2^63 or more: keys whose sign or top bit the
/// encodings must keep.
fn sign(v: u64) -> &'static str {
    if v % 2 == 1 {
        "-"
    } else {
        ""
    }
}

/// 2^63, added to the odd unsigned draws.
const TOP_BIT: u64 = 1 << 63;

/// The SQL literal of a value as [`rows_of`] prints it (`-NaN`: the NaN
/// with the sign bit; binary values in hex).
fn printed_literal(ty: &str, v: &str) -> String {
    match (is_float(ty), v) {
        (true, "-NaN") => format!("-CAST('NaN' AS {ty})"),
        // Binary values print as hex.
        _ if ty == "BYTEA" => format!("decode('{v}', 'hex')"),
        _ => format!("CAST('{v}' AS {ty})"),
    }
}

fn literal(ty: &str, v: u64) -> String {
    match ty {
        t if is_float(t) => float_literal(t, v),
        "VARCHAR" => format!("'s{v}'"),
        "BOOLEAN" => (v % 2 == 0).to_string(),
        "DATE" => format!("DATE '2024-01-{:02}'", 1 + v % 28),
        "BYTEA" => format!("'b{v}'"),
        "TIMESTAMP" => format!("TIMESTAMP '2024-01-01 00:{:02}:{:02}.{}'", v / 60 % 60, v % 60, v % 3),
        "TINYINT" => format!("{}{}", sign(v), v % 100),
        t if t.starts_with("DECIMAL") => format!("{}{}.{}", sign(v), v, v % 7),
        "BIGINT UNSIGNED" if v % 2 == 1 => format!("'{}'", TOP_BIT + v),
        "BIGINT UNSIGNED" => v.to_string(),
        _ if v % 2 == 1 => format!("-{v}"),
        _ => v.to_string(),
    }
}

/// SQL of the same value computed from an integer expression `x` (large tables).
fn value_expr(ty: &str, x: &str) -> String {
    match ty {
        "VARCHAR" => format!("'s' || CAST({x} AS VARCHAR)"),
        "BOOLEAN" => format!("({x}) % 2 = 0"),
        "DATE" => format!("to_date(concat('2024-01-', lpad(CAST(1 + ({x}) % 28 AS VARCHAR), 2, '0')))"),
        t if t.starts_with("DECIMAL") => {
            format!("(CAST(({x}) AS {ty}) + CAST(({x}) % 7 AS {ty}) / 10) * CASE ({x}) % 2 WHEN 1 THEN -1 ELSE 1 END")
        }
        "SMALLINT" => format!("CAST(({x}) % 30000 * CASE ({x}) % 2 WHEN 1 THEN -1 ELSE 1 END AS SMALLINT)"),
        "TINYINT" => format!("CAST(({x}) % 100 * CASE ({x}) % 2 WHEN 1 THEN -1 ELSE 1 END AS TINYINT)"),
        "BIGINT" | "INT" => format!("CAST(({x}) * CASE ({x}) % 2 WHEN 1 THEN -1 ELSE 1 END AS {ty})"),
        "BIGINT UNSIGNED" => format!(
            "CAST({x} AS BIGINT UNSIGNED) + CASE ({x}) % 2 WHEN 1 THEN CAST('{TOP_BIT}' AS BIGINT UNSIGNED) \
             ELSE CAST(0 AS BIGINT UNSIGNED) END"
        ),
        "BYTEA" => format!("CAST('b' || CAST({x} AS VARCHAR) AS BYTEA)"),
        "TIMESTAMP" => format!("to_timestamp_millis(1704067200000 + ({x}) * 1001)"),
        t if is_float(t) => format!(
            "CASE ({x}) % 11 WHEN 0 THEN CAST(-0.0 AS {t}) WHEN 1 THEN CAST('NaN' AS {t}) \
             WHEN 2 THEN -CAST('NaN' AS {t}) WHEN 3 THEN CAST('inf' AS {t}) \
             ELSE (CAST(({x}) / 11 AS {t}) + 0.25) * CASE ({x}) % 2 WHEN 1 THEN -1 ELSE 1 END END"
        ),
        _ => format!("CAST({x} AS {ty})"),
    }
}

/// The statement creating a random table `name` with columns `c0..` of `types`.
fn random_table(rng: &mut StdRng, name: &str, types: &[&str], max_rows: usize) -> String {
    let n = match rng.random_range(0..10) {
        0 => 0,
        1 => 1,
        2 if max_rows > 1000 => rng.random_range(1000..=max_rows),
        _ => rng.random_range(2..60),
    };
    let domain: u64 = if n > 100 { rng.random_range(2..(n as u64 * 2)) } else { rng.random_range(1..12) };
    let null_pct = rng.random_range(0..30);
    let cols: Vec<String> = types.iter().enumerate().map(|(i, t)| format!("c{i} {t}")).collect();
    if n == 0 {
        return format!("CREATE TABLE {name} ({})", cols.join(", "));
    }
    if n > 100 {
        // Generated by the engine: values and NULLs from multiplicative hashes of the row number.
        let salt: u64 = rng.random_range(1..1_000_000);
        let exprs: Vec<String> = types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let h = format!("((value * {} + {}) % 1000003)", 2654435761u64 + i as u64 * 40503, salt + i as u64);
                let v = value_expr(t, &format!("({h} % {domain})"));
                format!("CASE WHEN ((value * {} + {salt}) % 100) < {null_pct} THEN CAST(NULL AS {t}) ELSE CAST({v} AS {t}) END AS c{i}", 97 + i * 31)
            })
            .collect();
        return format!("CREATE TABLE {name} AS SELECT {} FROM generate_series(1, {n})", exprs.join(", "));
    }
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

/// A float value's text, equal for values DataFusion holds equal: -0.0 as
/// 0.0, the NaN with the sign bit as -NaN (Arrow prints both NaNs alike).
/// None for other types.
fn float_text(c: &ArrayRef, i: usize) -> Option<String> {
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};
    let v = match c.data_type() {
        DataType::Float64 => c.as_primitive::<Float64Type>().value(i),
        DataType::Float32 => c.as_primitive::<Float32Type>().value(i) as f64,
        _ => return None,
    };
    Some(match v {
        v if v.is_nan() && v.is_sign_negative() => "-NaN".to_string(),
        v if v == 0.0 => "0".to_string(),
        v => v.to_string(),
    })
}

fn rows_of(batches: &[RecordBatch]) -> Result<Vec<Row>> {
    let mut rows = rows_as_returned(batches)?;
    rows.sort();
    Ok(rows)
}

/// The rows in the order the engine returned them.
fn rows_as_returned(batches: &[RecordBatch]) -> Result<Vec<Row>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let mut rows = Vec::new();
    let options = FormatOptions::default();
    for b in batches {
        // One formatter per column and batch (a formatter per value was most of a large round's time).
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for i in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .zip(&formatters)
                    .map(|(c, f)| (!c.is_null(i)).then(|| float_text(c, i).unwrap_or_else(|| f.value(i).to_string())))
                    .collect(),
            );
        }
    }
    Ok(rows)
}

/// Where rows returned for `ORDER BY 1` break that order (the first column
/// ascending by SQL's order of its type `ty`, NULLs last): the first pair out
/// of order, if any.
fn out_of_order<'r>(rows: &'r [Row], ty: &str) -> Option<(&'r Row, &'r Row)> {
    rows.windows(2).map(|w| (&w[0], &w[1])).find(|(x, y)| match (&x[0], &y[0]) {
        (None, Some(_)) => true,
        (Some(a), Some(b)) => cmp_values(ty, a, b).is_gt(),
        _ => false,
    })
}

async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<Row>> {
    rows_of(&ctx.sql(sql).await?.collect().await?)
}

/// [`collect`] in the order the engine returned the rows.
async fn collect_as_returned(ctx: &SessionContext, sql: &str) -> Result<Vec<Row>> {
    rows_as_returned(&ctx.sql(sql).await?.collect().await?)
}

async fn setup(ctx: &SessionContext, stmts: &[String], settings: &[&str]) -> Result<()> {
    for s in settings.iter().map(|s| s.to_string()).chain(stmts.iter().cloned()) {
        ctx.sql(&s).await?.collect().await?;
    }
    Ok(())
}

/// [`setup`] with the round's tables made by `stmts`, or read from their Parquet files.
async fn round_setup(
    ctx: &SessionContext,
    stmts: &[String],
    settings: &[&str],
    parquet: Option<&ParquetTables>,
) -> Result<()> {
    match parquet {
        None => setup(ctx, stmts, settings).await,
        Some(p) => {
            setup(ctx, &[], settings).await?;
            p.register(ctx).await
        }
    }
}

/// Exact SQL multiset semantics (NULLs equal, as in set operations).
fn set_op(op: &str, a: &[Row], b: &[Row]) -> Vec<Row> {
    let mut nb: HashMap<&Row, usize> = HashMap::new();
    b.iter().for_each(|r| *nb.entry(r).or_default() += 1);
    let mut ma: HashMap<&Row, usize> = HashMap::new();
    a.iter().for_each(|r| *ma.entry(r).or_default() += 1);
    let mut out = Vec::new();
    for (r, &m) in &ma {
        let n = nb.get(r).copied().unwrap_or(0);
        let copies = match op {
            "INTERSECT ALL" => m.min(n),
            "EXCEPT ALL" => m.saturating_sub(n),
            "INTERSECT" => (n > 0) as usize,
            _ => (n == 0) as usize,
        };
        out.extend(std::iter::repeat_n((*r).clone(), copies));
    }
    out
}

/// SQL equality of two values: NULL when either is NULL.
fn eq3(a: &Option<String>, b: &Option<String>) -> Option<bool> {
    Some(a.as_ref()? == b.as_ref()?)
}

/// A subquery predicate over `b` for each row of `a`, by SQL's rules.
struct Predicate {
    /// IN or a quantified comparison: (a's column, b's column) compared; None: EXISTS.
    key: Option<(usize, usize)>,
    /// Correlation `b.c_j = a.c_j`.
    corr: Option<usize>,
    /// Residual `b.c_j <> a.c_j`.
    residual: Option<usize>,
    negated: bool,
    /// `a.c_i op ANY / ALL (...)` instead of IN.
    quant: Option<Quant>,
    /// The subquery's FROM is an outer join of the correlated rows of `b` with `b`.
    outer: Option<OuterJoin>,
}

/// `op ANY / SOME / ALL`.
#[derive(Debug, Clone, Copy)]
struct Quant {
    op: &'static str,
    any: bool,
    /// ANY spelt SOME.
    some: bool,
}

const COMPARISONS: [&str; 6] = ["=", "<>", "<", "<=", ">", ">="];

/// `FROM <x> {join} JOIN <y> ON x.c_on = y.c_on` with `x` the rows of `b`
/// where `b.c_k = a.c_k` (the correlation), `y` all of `b`; `x` on the left
/// when `corr_left`; the subquery's value from `x` when `value_from_corr`.
#[derive(Debug, Clone, Copy)]
struct OuterJoin {
    join: &'static str,
    corr_left: bool,
    on: usize,
    value_from_corr: bool,
    /// Columns of `b`.
    ncols: usize,
    /// y's columns renamed (`d0, d1, ..`), else y is `b` itself and its
    /// columns share their names with x's (and the correlated column's).
    rename_y: bool,
}

impl OuterJoin {
    /// Whether the join keeps each row of the correlated side (x) / of y.
    fn preserves(&self) -> (bool, bool) {
        match (self.join, self.corr_left) {
            ("LEFT", left) => (left, !left),
            ("RIGHT", left) => (!left, left),
            _ => (true, true),
        }
    }
}

/// SQL order of two non-NULL values of a column type (canonical strings).
fn cmp_values(ty: &str, x: &str, y: &str) -> std::cmp::Ordering {
    match ty {
        "BIGINT" | "INT" | "SMALLINT" | "TINYINT" | "BIGINT UNSIGNED" => {
            x.parse::<i128>().expect("integer").cmp(&y.parse::<i128>().expect("integer"))
        }
        t if is_float(t) => {
            let parse = |v: &str| if v == "-NaN" { -f64::NAN } else { v.parse::<f64>().expect("float") };
            parse(x).total_cmp(&parse(y))
        }
        t if t.starts_with("DECIMAL") => {
            x.parse::<f64>().expect("decimal").total_cmp(&y.parse::<f64>().expect("decimal"))
        }
        // VARCHAR by bytes, DATE as ISO text, BOOLEAN false < true.
        _ => x.cmp(y),
    }
}

/// `x op y` by SQL's rules: NULL when either is NULL.
fn compare3(ty: &str, x: Option<&String>, y: Option<&String>, op: &str) -> Option<bool> {
    use std::cmp::Ordering::*;
    let o = cmp_values(ty, x?, y?);
    Some(match op {
        "=" => o == Equal,
        "<>" => o != Equal,
        "<" => o == Less,
        "<=" => o != Greater,
        ">" => o == Greater,
        _ => o != Less,
    })
}

impl Predicate {
    fn sql(&self) -> String {
        let not = if self.negated { "NOT " } else { "" };
        let (from, value_of) = match (self.outer, self.corr) {
            (Some(oj), Some(k)) => {
                let x = format!("(SELECT * FROM b WHERE b.c{k} = a.c{k}) x");
                let (y, yc) = if oj.rename_y {
                    let renamed = (0..oj.ncols).map(|c| format!("c{c} AS d{c}")).collect::<Vec<_>>().join(", ");
                    (format!("(SELECT {renamed} FROM b) y"), "y.d")
                } else {
                    ("b y".to_string(), "y.c")
                };
                let (l, r) = if oj.corr_left { (x, y) } else { (y, x) };
                (
                    format!("FROM {l} {} JOIN {r} ON x.c{on} = {yc}{on}", oj.join, on = oj.on),
                    if oj.value_from_corr { "x.c" } else { yc },
                )
            }
            _ => {
                let mut conds = Vec::new();
                if let Some(j) = self.corr {
                    conds.push(format!("b.c{j} = a.c{j}"));
                }
                if let Some(j) = self.residual {
                    conds.push(format!("b.c{j} <> a.c{j}"));
                }
                let where_sql =
                    if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
                (format!("FROM b{where_sql}"), "b.c")
            }
        };
        match (self.key, self.quant) {
            (Some((i, j)), Some(q)) => {
                let word = if !q.any {
                    "ALL"
                } else if q.some {
                    "SOME"
                } else {
                    "ANY"
                };
                format!("{not}(a.c{i} {} {word} (SELECT {value_of}{j} {from}))", q.op)
            }
            (Some((i, j)), None) => format!("a.c{i} {not}IN (SELECT {value_of}{j} {from})"),
            (None, _) => format!("{not}EXISTS (SELECT 1 {from})"),
        }
    }

    /// The predicate's value for every row of `a`, from each row's subquery
    /// values listed one by one (quantified comparisons, outer joins).
    fn eval_listed(&self, a: &[Row], b: &[Row], ty: &str) -> Vec<Option<bool>> {
        let by = |j: usize| {
            let mut m: HashMap<&String, Vec<&Row>> = HashMap::new();
            b.iter().filter_map(|r| r[j].as_ref().map(|v| (v, r))).for_each(|(v, r)| m.entry(v).or_default().push(r));
            m
        };
        let groups = self.corr.map(by);
        let on_index = self.outer.map(|oj| by(oj.on));
        let j = self.key.map_or(0, |(_, j)| j);
        let everything: Vec<&Row> = b.iter().collect();
        let values_of = |o: &Row| -> Vec<Option<&String>> {
            let group: Vec<&Row> = match (self.corr, &groups) {
                (Some(k), Some(g)) => o[k].as_ref().and_then(|v| g.get(v)).cloned().unwrap_or_default(),
                _ => everything.clone(),
            };
            let group =
                group.into_iter().filter(|r| self.residual.is_none_or(|res| eq3(&r[res], &o[res]) == Some(false)));
            let Some(oj) = self.outer else { return group.map(|r| r[j].as_ref()).collect() };
            let index = on_index.as_ref().expect("outer join index");
            let (x_kept, y_kept) = oj.preserves();
            let mut out = Vec::new();
            let mut matched: std::collections::HashSet<*const Row> = std::collections::HashSet::new();
            for x in group {
                let ys: &[&Row] =
                    x[oj.on].as_ref().and_then(|v| index.get(v)).map(|v| v.as_slice()).unwrap_or_default();
                for y in ys {
                    matched.insert(*y as *const Row);
                    out.push(if oj.value_from_corr { x[j].as_ref() } else { y[j].as_ref() });
                }
                if ys.is_empty() && x_kept {
                    out.push(if oj.value_from_corr { x[j].as_ref() } else { None });
                }
            }
            if y_kept {
                for y in b.iter().filter(|y| !matched.contains(&(*y as *const Row))) {
                    out.push(if oj.value_from_corr { None } else { y[j].as_ref() });
                }
            }
            out
        };
        // Without a residual filter a row's values depend only on its correlation value.
        let mut cache: HashMap<Option<&String>, Vec<Option<&String>>> = HashMap::new();
        a.iter()
            .map(|o| {
                let fresh;
                let values = match (self.residual, self.corr) {
                    (None, corr) => &*cache.entry(corr.and_then(|k| o[k].as_ref())).or_insert_with(|| values_of(o)),
                    _ => {
                        fresh = values_of(o);
                        &fresh
                    }
                };
                let mark = match self.key {
                    None => Some(!values.is_empty()),
                    Some((i, _)) => {
                        let q = self.quant.unwrap_or(Quant { op: "=", any: true, some: false });
                        let (mut t, mut f, mut null) = (false, false, false);
                        for v in values {
                            match compare3(ty, o[i].as_ref(), *v, q.op) {
                                Some(true) => t = true,
                                Some(false) => f = true,
                                None => null = true,
                            }
                        }
                        // ANY: FALSE over an empty set, TRUE if one is TRUE, else NULL if one is NULL;
                        // ALL: TRUE over an empty set, FALSE if one is FALSE, else NULL if one is NULL.
                        match (q.any, t, f, null) {
                            (true, true, _, _) => Some(true),
                            (false, _, true, _) => Some(false),
                            (_, _, _, true) => None,
                            (any, ..) => Some(!any),
                        }
                    }
                };
                if self.negated {
                    mark.map(|m| !m)
                } else {
                    mark
                }
            })
            .collect()
    }

    /// The predicate's value for every row of `a` (groups found by hashing the correlation column).
    fn eval(&self, a: &[Row], b: &[Row], ty: &str) -> Vec<Option<bool>> {
        if self.quant.is_some() || self.outer.is_some() {
            return self.eval_listed(a, b, ty);
        }
        let mut groups: HashMap<Option<&String>, Vec<&Row>> = HashMap::new();
        for r in b {
            let key = match self.corr {
                Some(j) => match &r[j] {
                    Some(v) => Some(v),
                    None => continue, // NULL equals nothing: in no group
                },
                None => None,
            };
            groups.entry(key).or_default().push(r);
        }
        let empty = Vec::new();
        let mut summaries: HashMap<usize, (std::collections::HashSet<&String>, bool)> = HashMap::new();
        a.iter()
            .map(|o| {
                let group = match self.corr {
                    Some(j) => match &o[j] {
                        Some(v) => groups.get(&Some(v)).unwrap_or(&empty),
                        None => &empty,
                    },
                    None => groups.get(&None).unwrap_or(&empty),
                };
                let mark = match (self.key, self.residual) {
                    (None, None) => Some(!group.is_empty()),
                    (Some((i, j)), None) => {
                        // Without a residual filter a group is summarised once (its values, a NULL among them).
                        let summary = summaries.entry(group.as_ptr() as usize).or_insert_with(|| {
                            (group.iter().filter_map(|r| r[j].as_ref()).collect(), group.iter().any(|r| r[j].is_none()))
                        });
                        match &o[i] {
                            _ if group.is_empty() => Some(false),
                            Some(v) if summary.0.contains(v) => Some(true),
                            None => None,
                            Some(_) if summary.1 => None,
                            Some(_) => Some(false),
                        }
                    }
                    (key, Some(res)) => {
                        let members = group.iter().filter(|r| eq3(&r[res], &o[res]) == Some(false));
                        match key {
                            None => Some(members.count() > 0),
                            Some((i, j)) => {
                                let (mut any, mut matched, mut null) = (false, false, false);
                                for r in members {
                                    any = true;
                                    match eq3(&o[i], &r[j]) {
                                        Some(true) => matched = true,
                                        Some(false) => {}
                                        None => null = true,
                                    }
                                }
                                if matched {
                                    Some(true)
                                } else if any && null {
                                    None
                                } else {
                                    Some(false)
                                }
                            }
                        }
                    }
                };
                if self.negated {
                    mark.map(|m| !m)
                } else {
                    mark
                }
            })
            .collect()
    }
}

/// Pairs of rows with equal `corr` values (every pair without one).
fn candidate_pairs(a: &[Row], b: &[Row], corr: Option<usize>) -> usize {
    let Some(j) = corr else { return a.len() * b.len() };
    let mut nb: HashMap<&String, usize> = HashMap::new();
    b.iter().filter_map(|r| r[j].as_ref()).for_each(|v| *nb.entry(v).or_default() += 1);
    a.iter().filter_map(|r| r[j].as_ref()).map(|v| nb.get(v).copied().unwrap_or(0)).sum()
}

/// A random query over `a` / `b` of `types` and its answer by the rules.
/// What a query must give: its rows, or an error whose message holds the text.
type Expected = std::result::Result<Vec<Row>, &'static str>;

fn random_query(rng: &mut StdRng, types: &[&str], a: &[Row], b: &[Row]) -> (String, Expected) {
    let ncols = types.len();
    let all = (0..ncols).map(|i| format!("a.c{i}")).collect::<Vec<_>>().join(", ");
    let bare = (0..ncols).map(|i| format!("c{i}")).collect::<Vec<_>>().join(", ");
    let kind = rng.random_range(0..10);
    if kind < 4 {
        let op = ["INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"][kind];
        return (format!("SELECT {bare} FROM a {op} SELECT {bare} FROM b"), Ok(set_op(op, a, b)));
    }
    // Columns of the same type may be compared: IN on (i, j), correlation on another.
    let i = rng.random_range(0..ncols);
    let same: Vec<usize> = (0..ncols).filter(|&j| types[j] == types[i]).collect();
    let j = same[rng.random_range(0..same.len())];
    let others: Vec<usize> = (0..ncols).filter(|&c| c != i).collect();
    let pick = |rng: &mut StdRng| {
        (!others.is_empty() && rng.random_bool(0.6)).then(|| others[rng.random_range(0..others.len())])
    };
    let corr = pick(rng);
    // A residual filter is evaluated per candidate pair (as by any engine): keep
    // the pairs it sees to a few million, so a run stays quick.
    let residual = pick(rng).filter(|r| Some(*r) != corr && candidate_pairs(a, b, corr) <= 4_000_000);
    let mut key = rng.random_bool(0.6).then_some((i, j));
    // Quantified comparisons list every candidate pair (capped like a residual filter).
    let quant = (rng.random_bool(0.3) && candidate_pairs(a, b, corr) <= 4_000_000).then(|| Quant {
        op: COMPARISONS[rng.random_range(0..COMPARISONS.len())],
        any: rng.random_bool(0.5),
        some: rng.random_bool(0.3),
    });
    if quant.is_some() {
        key = Some((i, j));
    }
    // An outer join inside a correlated subquery (small tables: the reference joins per group).
    let outer =
        (crate::env::fuzz_outer_joins() && corr.is_some() && a.len() <= 100 && b.len() <= 100 && rng.random_bool(0.25))
            .then(|| OuterJoin {
                join: ["LEFT", "RIGHT", "FULL"][rng.random_range(0..3)],
                corr_left: rng.random_bool(0.5),
                on: rng.random_range(0..ncols),
                value_from_corr: rng.random_bool(0.5),
                ncols,
                rename_y: rng.random_bool(0.5),
            });
    let residual = if outer.is_some() { None } else { residual };
    let pred = Predicate { key, corr, residual, negated: rng.random_bool(0.5), quant, outer };
    let marks = pred.eval(a, b, types[i]);
    let p = pred.sql();
    // An OR partner that is TRUE for some rows: a's column 0 equals one of its values.
    let partner = a.get(rng.random_range(0..a.len().max(1))).and_then(|r| r[0].clone());
    let context = if kind < 6 { 0 } else { rng.random_range(1..6) };
    let partner_sql = match &partner {
        Some(v) => format!("a.c0 = {}", printed_literal(types[0], v)),
        None => "false".to_string(),
    };
    // Sometimes sorted: DataFusion may then sort a's side below its join, under the join's
    // dynamic filter (which dropped -0.0 matching 0.0 over float keys).
    let order = if rng.random_bool(0.5) { " ORDER BY 1" } else { "" };
    let sql = match context {
        0 => format!("SELECT {all} FROM a WHERE {p}{order}"),
        1 => format!("SELECT {all} FROM a WHERE {p} OR {partner_sql}"),
        2 => format!("SELECT {all} FROM a WHERE NOT ({p})"),
        3 => format!("SELECT {all} FROM a WHERE ({p}) IS NULL"),
        4 => format!("SELECT {all}, {p} FROM a"),
        _ => format!("SELECT {all}, CASE WHEN {p} THEN 1 ELSE 0 END FROM a"),
    };
    let mut want = Vec::new();
    for (r, m) in a.iter().zip(&marks) {
        let keep = match context {
            0 => *m == Some(true),
            1 => *m == Some(true) || (partner.is_some() && r[0] == partner),
            2 => *m == Some(false),
            3 => m.is_none(),
            _ => true,
        };
        if !keep {
            continue;
        }
        let mut row = r.clone();
        match context {
            4 => row.push(m.map(|b| b.to_string())),
            5 => row.push(Some(if *m == Some(true) { "1" } else { "0" }.to_string())),
            _ => {}
        }
        want.push(row);
    }
    (sql, Ok(want))
}

/// Run the fuzz: Err describes the first mismatch, reproducibly.
pub async fn run(opts: &FuzzOptions) -> Result<FuzzReport> {
    let report = run_rounds(opts).await;
    // A mismatch keeps its round's files (the message names their folder).
    if report.is_ok() {
        let _ = std::fs::remove_dir_all(fuzz_dir());
    }
    report
}

async fn run_rounds(opts: &FuzzOptions) -> Result<FuzzReport> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let gpu = opts.gpu && crate::slt::gpu_mode_status().is_ok();
    let mut report = FuzzReport {
        backends: vec!["cpu".into(), "default settings".into(), "cpu/partitioned (set operators only)".into()],
        ..Default::default()
    };
    if gpu {
        report.backends.extend(["gpu/auto", "gpu/hash", "gpu/bitmap", "gpu/sort"].map(String::from));
    }
    while report.queries < opts.queries {
        report.rounds += 1;
        // One round in three: list functions, families or similarity joins instead of set operators.
        match rng.random_range(0..9) {
            0 => {
                report.queries += list_round(&mut rng, opts, gpu, report.rounds).await?;
                continue;
            }
            1 => {
                report.queries += families_round(&mut rng, opts, gpu, report.rounds).await?;
                continue;
            }
            2 => {
                report.queries += similarity_round(&mut rng, opts, gpu, report.rounds).await?;
                continue;
            }
            _ => {}
        }
        let ncols = rng.random_range(1..=3);
        let types: Vec<&str> = (0..ncols).map(|_| TYPES[rng.random_range(0..TYPES.len())]).collect();
        let stmts = vec![
            random_table(&mut rng, "a", &types, opts.max_rows),
            random_table(&mut rng, "b", &types, opts.max_rows),
        ];
        let plain = SessionContext::new();
        setup(&plain, &stmts, &[]).await?;
        // One round in three reads the tables from Parquet files written from them.
        let parquet = match ParquetLayout::draw(&mut rng) {
            Some(layout) => {
                let (ta, tb) = (table_batch(&plain, "a").await?, table_batch(&plain, "b").await?);
                Some(ParquetTables::write(layout, &[("a", &ta), ("b", &tb)])?)
            }
            None => None,
        };
        let mut shown = stmts.clone();
        shown.extend(parquet.as_ref().map(|p| format!("-- {}", p.layout.describe())));
        let cols = (0..ncols).map(|i| format!("c{i}")).collect::<Vec<_>>().join(", ");
        // The tables as the engine holds them (unsorted order does not matter to the rules).
        let a = collect(&plain, &format!("SELECT {cols} FROM a")).await?;
        let b = collect(&plain, &format!("SELECT {cols} FROM b")).await?;
        report.largest_table = report.largest_table.max(a.len()).max(b.len());
        let mut contexts = Vec::new();
        let cpu = setfusion::context();
        round_setup(&cpu, &stmts, &["SET setfusion.strategy = 'cpu'"], parquet.as_ref()).await?;
        contexts.push(("cpu", cpu));
        // Default settings: the cost model's choices, DataFusion's own operators where they are right.
        let default = setfusion::context();
        round_setup(&default, &stmts, &[], parquet.as_ref()).await?;
        contexts.push(("default", default));
        // As on a Ballista cluster: set operations and semi joins over hash-partitioned
        // inputs, each partition on its own; mark joins with the subquery side broadcast.
        let partitioned = setfusion::context();
        let settings = ["SET setfusion.strategy = 'cpu'", "SET setfusion.hash_partition_inputs = true"];
        round_setup(&partitioned, &stmts, &settings, parquet.as_ref()).await?;
        contexts.push(("cpu/partitioned", partitioned));
        if gpu {
            for strategy in ["auto", "hash", "bitmap", "sort"] {
                let g = setfusion::context();
                let settings = ["SET setfusion.min_rows = 0", &format!("SET setfusion.strategy = '{strategy}'")];
                round_setup(&g, &stmts, &settings, parquet.as_ref()).await?;
                contexts.push((strategy, g));
            }
        }
        for _ in 0..20 {
            let (sql, mut want) = random_query(&mut rng, &types, &a, &b);
            if let Ok(rows) = &mut want {
                rows.sort();
            }
            // Does plain DataFusion fail on it too (asked once, on the first error)?
            let mut plain_fails: Option<bool> = None;
            for (backend, ctx) in &contexts {
                trace_query(report.rounds, backend, &sql);
                let got = collect_as_returned(ctx, &sql).await;
                // A sorted query's rows come in its order.
                let unordered = got.as_ref().ok().filter(|_| sql.ends_with(" ORDER BY 1")).and_then(|rows| {
                    out_of_order(rows, types[0])
                        .map(|(x, y)| format!("rows out of ORDER BY 1's order: {x:?} before {y:?}"))
                });
                if let Some(what) = unordered {
                    return Err(mismatch(opts, report.rounds, backend, &sql, &shown, &what));
                }
                let got = got.map(|mut rows| {
                    rows.sort();
                    rows
                });
                let what = match (got, &want) {
                    (Ok(got), Ok(want)) if got == *want => continue,
                    (Ok(got), Ok(want)) => format!("{} rows, expected {}", got.len(), want.len()),
                    (Err(e), Err(refused)) if e.to_string().contains(refused) => continue,
                    (Err(e), Ok(_)) => {
                        if plain_fails.is_none() {
                            plain_fails = Some(collect(&plain, &sql).await.is_err());
                        }
                        if plain_fails == Some(true) {
                            if report.first_refused.is_none() {
                                report.first_refused = Some(format!("{sql}: {}", setfusion::util::one_line(&e)));
                            }
                            continue;
                        }
                        format!("error: {e} (plain DataFusion answers)")
                    }
                    (Err(e), _) => format!("error: {e}"),
                    (Ok(got), Err(refused)) => format!("{} rows, expected the error '{refused}'", got.len()),
                };
                return Err(mismatch(opts, report.rounds, backend, &sql, &shown, &what));
            }
            report.refused += plain_fails.unwrap_or(false) as usize;
            report.queries += 1;
            if report.queries % 1000 == 0 {
                eprintln!("fuzz: {} queries agree so far (round {})", report.queries, report.rounds);
            }
        }
    }
    Ok(report)
}

/// Appends the query about to run to `SETFUSION_FUZZ_TRACE`'s file (flushed:
/// the line stays when the process dies on the query).
fn trace_query(round: usize, backend: &str, sql: &str) {
    use std::io::Write;
    let Some(path) = crate::env::fuzz_trace() else { return };
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = writeln!(f, "round {round} {backend}: {sql}");
    }
}

fn mismatch(
    opts: &FuzzOptions,
    round: usize,
    backend: &str,
    sql: &str,
    stmts: &[String],
    what: &str,
) -> DataFusionError {
    let mut msg = format!(
        "fuzz mismatch (seed {}, round {round}, backend {backend}): {what}\nquery: {sql}\ntables:\n",
        opts.seed
    );
    for s in stmts {
        let shown: String = s.chars().take(4000).collect();
        let _ = writeln!(msg, "  {shown}{}", if s.len() > 4000 { " ..." } else { ";" });
    }
    let _ = write!(
        msg,
        "reproduce: setfusion fuzz --seed {} --queries {} --max-rows {}",
        opts.seed,
        round * 20,
        opts.max_rows
    );
    DataFusionError::Execution(msg)
}

/// `setfusion fuzz`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    /// Queries to run (20 per round of fresh tables)
    #[arg(long, value_name = "N", default_value_t = FuzzOptions::default().queries)]
    pub queries: usize,
    /// Seed of the random tables and queries
    #[arg(long, value_name = "S", default_value_t = FuzzOptions::default().seed)]
    pub seed: u64,
    /// Largest table drawn (about one table in ten is large)
    #[arg(long, value_name = "N", default_value_t = FuzzOptions::default().max_rows)]
    pub max_rows: usize,
    /// Only the CPU backends, even where a GPU is usable
    #[arg(long)]
    pub cpu_only: bool,
}

impl From<FuzzArgs> for FuzzOptions {
    fn from(a: FuzzArgs) -> Self {
        FuzzOptions { queries: a.queries, seed: a.seed, max_rows: a.max_rows, gpu: !a.cpu_only }
    }
}

/// The CLI command: run, print the report; exit status 1 on a mismatch.
pub async fn cli(args: FuzzArgs) -> Result<i32> {
    let opts = FuzzOptions::from(args);
    let t = std::time::Instant::now();
    match run(&opts).await {
        Ok(r) => {
            println!(
                "fuzz: {} queries in {} rounds (seed {}, tables up to {} rows) agree with the reference on {} in {:.1} s; {} of them failed with an error on plain DataFusion and setfusion alike",
                r.queries,
                r.rounds,
                opts.seed,
                r.largest_table,
                r.backends.join(", "),
                t.elapsed().as_secs_f64(),
                r.refused
            );
            if let Some(first) = &r.first_refused {
                println!("fuzz: the first of them: {first}");
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(1)
        }
    }
}

// ---------------------------------------------------------------- list functions and families

/// A random list column: `rows` rows of up to `max_len` values in [0, domain),
/// odd ones negative with `negative` (over domains larger than 3), `null_pct`
/// percent NULL lists, a few NULL elements; `sets`: no value twice in a row.
fn random_lists(
    rng: &mut StdRng,
    rows: usize,
    max_len: usize,
    domain: i64,
    null_pct: u32,
    sets: bool,
    negative: bool,
) -> Vec<Option<Vec<Option<i64>>>> {
    (0..rows)
        .map(|_| {
            if rng.random_range(0..100) < null_pct {
                return None;
            }
            let len = rng.random_range(0..=max_len);
            let mut v: Vec<Option<i64>> = (0..len)
                .map(|_| match rng.random_range(0..40) {
                    0 => None,
                    _ => {
                        Some(rng.random_range(0..domain))
                            .map(|v| if negative && v % 2 == 1 && domain > 3 { -v } else { v })
                    }
                })
                .collect();
            if sets {
                let mut seen = std::collections::HashSet::new();
                v.retain(|x| x.is_none_or(|x| seen.insert(x)));
            }
            Some(v)
        })
        .collect()
}

fn list_array(rows: &[Option<Vec<Option<i64>>>]) -> datafusion::arrow::array::ArrayRef {
    use datafusion::arrow::array::ListArray;
    use datafusion::arrow::datatypes::Int64Type;
    std::sync::Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().cloned()))
}

/// The string named by a value: 7 bytes or fewer for most, longer for every
/// third (the list functions key the two kinds apart).
fn element_name(v: i64) -> String {
    if v % 3 == 0 {
        format!("a longer string {v}")
    } else {
        format!("w{v}")
    }
}

/// A string list column: each value as [`element_name`].
fn string_list_array(rows: &[Option<Vec<Option<i64>>>]) -> datafusion::arrow::array::ArrayRef {
    use datafusion::arrow::array::{ListBuilder, StringBuilder};
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in rows {
        match row {
            None => b.append(false),
            Some(v) => {
                for x in v {
                    b.values().append_option(x.map(element_name));
                }
                b.append(true);
            }
        }
    }
    std::sync::Arc::new(b.finish())
}

/// A string list's result as the engine prints it: the values' names, in byte order.
fn fmt_names(v: &[i64]) -> String {
    let mut names: Vec<String> = v.iter().map(|&x| element_name(x)).collect();
    names.sort();
    format!("[{}]", names.join(", "))
}

/// A list as the engine prints it.
fn fmt_list(v: &[i64]) -> String {
    format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// Value counts of a list's non-NULL elements.
fn counts(v: &[Option<i64>]) -> std::collections::BTreeMap<i64, usize> {
    let mut m = std::collections::BTreeMap::new();
    v.iter().flatten().for_each(|x| *m.entry(*x).or_default() += 1);
    m
}

/// The count-based reference of a multiset rule.
fn multiset_reference(op: &str, a: &[Option<i64>], b: &[Option<i64>]) -> Vec<i64> {
    let (ca, cb) = (counts(a), counts(b));
    let mut keys: Vec<i64> = ca.keys().chain(cb.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let mut out = Vec::new();
    for x in keys {
        let (m, n) = (ca.get(&x).copied().unwrap_or(0), cb.get(&x).copied().unwrap_or(0));
        let copies = match op {
            "set_intersect_all" | "sorted_intersect" => m.min(n),
            "set_except_all" => m.saturating_sub(n),
            "set_union_all" => m.max(n),
            _ => m.abs_diff(n),
        };
        out.extend(std::iter::repeat_n(x, copies));
    }
    out
}

/// The contexts a list / families round runs on: CPU, default settings, and
/// where a GPU is usable the device with `min_rows = 0` (auto and forced).
/// The tables are the batches, or one round in three Parquet files written
/// from them; the second value says which (for a mismatch's message).
async fn list_contexts(
    rng: &mut StdRng,
    gpu: bool,
    tables: &[(&str, &RecordBatch)],
) -> Result<(Vec<(&'static str, SessionContext)>, String)> {
    let parquet = ParquetLayout::draw(rng).map(|layout| ParquetTables::write(layout, tables)).transpose()?;
    let mut settings: Vec<(&'static str, Vec<&str>)> =
        vec![("cpu", vec!["SET setfusion.strategy = 'cpu'"]), ("default", vec![])];
    if gpu {
        settings.push(("gpu/auto", vec!["SET setfusion.min_rows = 0"]));
        settings.push(("gpu/hash", vec!["SET setfusion.min_rows = 0", "SET setfusion.strategy = 'hash'"]));
    }
    let mut out = Vec::new();
    for (name, s) in settings {
        let ctx = setfusion::context();
        setup(&ctx, &[], &s).await?;
        match &parquet {
            None => {
                for (name, batch) in tables {
                    ctx.register_batch(*name, (*batch).clone())?;
                }
            }
            Some(p) => p.register(&ctx).await?,
        }
        out.push((name, ctx));
    }
    let source = parquet.map_or_else(|| "in memory".to_string(), |p| p.layout.describe());
    Ok((out, source))
}

/// One round of 20 random list-function queries (the four rules,
/// `sorted_intersect`, `set_intersect_agg`) over a random table
/// `l(id, g, a, b)`, against the count-based reference.
async fn list_round(rng: &mut StdRng, opts: &FuzzOptions, gpu: bool, round: usize) -> Result<usize> {
    use datafusion::arrow::array::Int64Array;
    let rows = if rng.random_range(0..5) == 0 {
        rng.random_range(100..=opts.max_rows.clamp(100, 20_000))
    } else {
        rng.random_range(0..40)
    };
    let max_len = [0, 3, 10, 60][rng.random_range(0..4)];
    let domain = [1, 3, 10, 1000][rng.random_range(0..4)];
    let groups = rng.random_range(1..6);
    let (na, nb) = (rng.random_range(0..20), rng.random_range(0..20));
    // Half the rounds hold negative values (and cast no list to UInt32).
    let negative = rng.random_bool(0.5);
    let a = random_lists(rng, rows, max_len, domain, na, false, negative);
    let b = random_lists(rng, rows, max_len, domain, nb, false, negative);
    let g: Vec<i64> = (0..rows).map(|_| rng.random_range(0..groups)).collect();
    // One round in four: string lists (values named by element_name: short and long strings).
    let strings = rng.random_range(0..4) == 0;
    let column = |l: &[Option<Vec<Option<i64>>>]| if strings { string_list_array(l) } else { list_array(l) };
    let show = |v: &[i64]| if strings { fmt_names(v) } else { fmt_list(v) };
    let batch = RecordBatch::try_from_iter(vec![
        ("id", std::sync::Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _),
        ("g", std::sync::Arc::new(Int64Array::from(g.clone())) as _),
        ("a", column(&a)),
        ("b", column(&b)),
    ])?;
    let (contexts, source) = list_contexts(rng, gpu, &[("l", &batch)]).await?;
    let what = format!(
        "table l: {rows} rows of up to {max_len} {} in [0, {domain}){}, {groups} groups, {source}",
        if strings { "strings named by values" } else { "values" },
        if negative { " (odd ones negated)" } else { "" }
    );
    for _ in 0..20 {
        let kind = rng.random_range(0..7);
        let swap = rng.random_bool(0.5);
        let (x, y, cx, cy) = if swap { ("b", "a", &b, &a) } else { ("a", "b", &a, &b) };
        // Unsigned lists now and then (without negative values); strings as large or view strings.
        let arg = |c: &str, rng: &mut StdRng| match (rng.random_range(0..4), strings) {
            (0, false) if !negative => format!("arrow_cast({c}, 'List(UInt32)')"),
            (0, true) => format!("arrow_cast({c}, 'List(LargeUtf8)')"),
            (1, true) => format!("arrow_cast({c}, 'List(Utf8View)')"),
            _ => c.to_string(),
        };
        let (sql, mut want) = if kind < 6 {
            let f = [
                "set_intersect_all",
                "set_except_all",
                "set_union_all",
                "set_symmetric_difference",
                "sorted_intersect",
                "set_intersect_all",
            ][kind];
            let (ax, ay) = (arg(x, rng), arg(y, rng));
            let (ax, ay) = if f == "sorted_intersect" {
                (format!("array_sort({ax})"), format!("array_sort({ay})"))
            } else {
                (ax, ay)
            };
            let want: Vec<Row> = (0..rows)
                .map(|i| {
                    let v = match (&cx[i], &cy[i]) {
                        (Some(p), Some(q)) => Some(show(&multiset_reference(f, p, q))),
                        _ => None,
                    };
                    vec![Some(i.to_string()), v]
                })
                .collect();
            (format!("SELECT id, {f}({ax}, {ay}) FROM l"), want)
        } else {
            let mut per_group: std::collections::BTreeMap<i64, Option<Vec<Option<i64>>>> =
                std::collections::BTreeMap::new();
            for i in 0..rows {
                let entry = per_group.entry(g[i]).or_insert(None);
                if let Some(list) = &cx[i] {
                    *entry = Some(match entry.take() {
                        None => multiset_reference("set_intersect_all", list, list).into_iter().map(Some).collect(),
                        Some(acc) => {
                            multiset_reference("set_intersect_all", &acc, list).into_iter().map(Some).collect()
                        }
                    });
                }
            }
            let want = per_group
                .into_iter()
                .map(|(k, v)| vec![Some(k.to_string()), v.map(|v| show(&v.into_iter().flatten().collect::<Vec<_>>()))])
                .collect();
            (format!("SELECT g, set_intersect_agg({}) FROM l GROUP BY g", arg(x, rng)), want)
        };
        want.sort();
        answers_on(&contexts, opts, round, &sql, &what, &want).await?;
    }
    Ok(20)
}

/// One round of random `intersect_families` queries over random families
/// `f` and `g` (wide layout, unique ids), against a pairwise loop.
async fn families_round(rng: &mut StdRng, opts: &FuzzOptions, gpu: bool, round: usize) -> Result<usize> {
    use datafusion::arrow::array::Int64Array;
    let sizes = [rng.random_range(0..40), rng.random_range(0..40)];
    let max_len = [1, 4, 12][rng.random_range(0..3)];
    let domain = [3, 10, 40][rng.random_range(0..3)];
    let fams: Vec<Vec<Option<Vec<Option<i64>>>>> =
        sizes.iter().map(|&n| random_lists(rng, n, max_len, domain, 10, true, true)).collect();
    let batches: Vec<RecordBatch> = fams
        .iter()
        .map(|f| {
            RecordBatch::try_from_iter(vec![
                ("id", std::sync::Arc::new(Int64Array::from_iter_values(0..f.len() as i64)) as _),
                ("elements", list_array(f)),
            ])
        })
        .collect::<std::result::Result<_, _>>()?;
    let (contexts, source) = list_contexts(rng, gpu, &[("f", &batches[0]), ("g", &batches[1])]).await?;
    let set = |v: &Option<Vec<Option<i64>>>| -> std::collections::BTreeSet<i64> {
        v.iter().flatten().flatten().copied().collect()
    };
    let what = format!(
        "families f, g: {sizes:?} sets of up to {max_len} elements in [0, {domain}) (odd ones negated), {source}"
    );
    for _ in 0..10 {
        let level = ["distinct", "pairs", "all"][rng.random_range(0..3)];
        let self_form = rng.random_range(0..4) == 0;
        let (left, right) = if self_form { (&fams[0], &fams[0]) } else { (&fams[0], &fams[1]) };
        let mut pairs = Vec::new();
        for (i, s) in left.iter().enumerate() {
            for (j, t) in right.iter().enumerate() {
                if self_form && i >= j {
                    continue;
                }
                let both: Vec<i64> = set(s).intersection(&set(t)).copied().collect();
                if level == "all" || !both.is_empty() {
                    pairs.push((i, j, both));
                }
            }
        }
        let call = if self_form {
            format!("intersect_families('f', '{level}')")
        } else {
            format!("intersect_families('f', 'g', '{level}')")
        };
        let (sql, mut want): (String, Vec<Row>) = if level == "distinct" {
            let mut freq: std::collections::BTreeMap<Vec<i64>, usize> = std::collections::BTreeMap::new();
            pairs.iter().for_each(|(_, _, e)| *freq.entry(e.clone()).or_default() += 1);
            (
                format!("SELECT elements, frequency FROM {call}"),
                freq.into_iter().map(|(e, n)| vec![Some(fmt_list(&e)), Some(n.to_string())]).collect(),
            )
        } else {
            let rows = pairs
                .into_iter()
                .map(|(i, j, e)| vec![Some(i.to_string()), Some(j.to_string()), Some(fmt_list(&e))])
                .collect();
            (format!("SELECT left_id, right_id, elements FROM {call}"), rows)
        };
        want.sort();
        answers_on(&contexts, opts, round, &sql, &what, &want).await?;
    }
    Ok(10)
}

/// One round of 10 random similarity joins, `metric(x, y) op t` in either
/// operand order, over random list tables `p` and `q` (NULL lists, empty
/// lists, NULL and repeated elements), now and then with an equality key or
/// another condition, against the pairs listed in Rust: each metric by its
/// definition over the lists as sets (NULL elements and repeats dropped, a
/// NULL list joins nothing, two empty sets score 0), compared as DataFusion
/// compares doubles (IEEE's total order). Thresholds at exact fractions
/// (`CAST(1 AS DOUBLE) / 3` is the jaccard of 1 shared of 3), the metrics'
/// ends and past them.
async fn similarity_round(rng: &mut StdRng, opts: &FuzzOptions, gpu: bool, round: usize) -> Result<usize> {
    use datafusion::arrow::array::Int64Array;
    let sizes = [rng.random_range(0..60), rng.random_range(0..60)];
    let max_len = [1, 4, 12][rng.random_range(0..3)];
    let domain = [3, 10, 40][rng.random_range(0..3)];
    let tables: Vec<Vec<Option<Vec<Option<i64>>>>> =
        sizes.iter().map(|&n| random_lists(rng, n, max_len, domain, 10, false, true)).collect();
    let groups: Vec<Vec<i64>> = sizes.iter().map(|&n| (0..n).map(|_| rng.random_range(0..3)).collect()).collect();
    let batches: Vec<RecordBatch> = tables
        .iter()
        .zip(&groups)
        .map(|(t, g)| {
            RecordBatch::try_from_iter(vec![
                ("id", std::sync::Arc::new(Int64Array::from_iter_values(0..t.len() as i64)) as _),
                ("g", std::sync::Arc::new(Int64Array::from(g.clone())) as _),
                ("s", list_array(t)),
            ])
        })
        .collect::<std::result::Result<_, _>>()?;
    let (contexts, source) = list_contexts(rng, gpu, &[("p", &batches[0]), ("q", &batches[1])]).await?;
    let sets: Vec<Vec<Option<std::collections::BTreeSet<i64>>>> = tables
        .iter()
        .map(|t| t.iter().map(|l| l.as_ref().map(|l| l.iter().flatten().copied().collect())).collect())
        .collect();
    let what = format!("tables p, q: {sizes:?} lists of up to {max_len} values in [0, {domain}) (odd ones negated), 10% NULL, {source}");
    for _ in 0..10 {
        let metric = ["jaccard", "dice", "set_cosine", "overlap"][rng.random_range(0..4)];
        let (sql_t, t): (String, f64) = match rng.random_range(0..4) {
            0 => {
                let t = [0.0, -0.5, 1.0, 1.5, 2.0][rng.random_range(0..5)];
                (format!("{t:?}"), t)
            }
            1 if metric == "overlap" => {
                let t = rng.random_range(0..8);
                (t.to_string(), t as f64)
            }
            _ => {
                let den = rng.random_range(1..9);
                let num = rng.random_range(0..=den + 1);
                (format!("CAST({num} AS DOUBLE) / {den}"), num as f64 / den as f64)
            }
        };
        let strict = rng.random_bool(0.5);
        // Now and then the sets as strings (the elements' text: equal where the integers are).
        let (x, y) = if rng.random_bool(0.5) { ("a.s", "b.s") } else { ("b.s", "a.s") };
        let (x, y) = if rng.random_range(0..4) == 0 {
            (format!("arrow_cast({x}, 'List(Utf8)')"), format!("arrow_cast({y}, 'List(Utf8)')"))
        } else {
            (x.to_string(), y.to_string())
        };
        // Now and then the metric under a cast: one that truncates (a predicate
        // of its own, DataFusion's to answer) or, for overlap, one that keeps it.
        let cast = rng.random_range(0..8) == 0;
        let call = match (cast, metric) {
            (false, _) => format!("{metric}({x}, {y})"),
            (true, "overlap") => format!("CAST({metric}({x}, {y}) AS DOUBLE)"),
            (true, _) => format!("CAST({metric}({x}, {y}) AS INT)"),
        };
        let pred = match (strict, rng.random_bool(0.5)) {
            (false, false) => format!("{call} >= {sql_t}"),
            (true, false) => format!("{call} > {sql_t}"),
            (false, true) => format!("{sql_t} <= {call}"),
            (true, true) => format!("{sql_t} < {call}"),
        };
        let self_form = rng.random_range(0..4) == 0;
        let extra = ["", " AND a.id < b.id", " AND a.g = b.g", " AND a.id <> b.id", " AND cardinality(b.s) > 2"]
            [rng.random_range(0..5)];
        let right = if self_form { "p" } else { "q" };
        // Now and then both sides of a self join read the same columns: the join then reads
        // its input once, and over Parquet keeps its sets for the round's later queries.
        let both_g = self_form && rng.random_bool(0.5);
        let sql = format!(
            "SELECT a.id, b.id, b.g{} FROM p a JOIN {right} b ON {pred}{extra}",
            if both_g { ", a.g" } else { "" }
        );
        let (l, r) = (0, if self_form { 0 } else { 1 });
        let mut want: Vec<Row> = Vec::new();
        for (i, si) in sets[l].iter().enumerate() {
            for (j, sj) in sets[r].iter().enumerate() {
                let (Some(si), Some(sj)) = (si, sj) else { continue };
                let keep = match extra {
                    " AND a.id < b.id" => i < j,
                    " AND a.g = b.g" => groups[l][i] == groups[r][j],
                    " AND a.id <> b.id" => i != j,
                    " AND cardinality(b.s) > 2" => tables[r][j].as_ref().is_some_and(|l| l.len() > 2),
                    _ => true,
                };
                let (o, na, nb) = (si.intersection(sj).count() as f64, si.len() as f64, sj.len() as f64);
                let v = match metric {
                    "jaccard" if na + nb - o > 0.0 => o / (na + nb - o),
                    "dice" if na + nb > 0.0 => 2.0 * o / (na + nb),
                    "set_cosine" if na * nb > 0.0 => o / (na * nb).sqrt(),
                    "overlap" => o,
                    _ => 0.0,
                };
                let v = if cast { v.trunc() } else { v };
                let order = v.total_cmp(&t);
                if keep && (order.is_gt() || (!strict && order.is_eq())) {
                    let mut row = vec![Some(i.to_string()), Some(j.to_string()), Some(groups[r][j].to_string())];
                    if both_g {
                        row.push(Some(groups[l][i].to_string()));
                    }
                    want.push(row);
                }
            }
        }
        want.sort();
        answers_on(&contexts, opts, round, &sql, &what, &want).await?;
    }
    Ok(10)
}

/// A list, families or similarity query's rows on every context, against
/// `want` (sorted): Err names the first backend that differs, and where.
async fn answers_on(
    contexts: &[(&str, SessionContext)],
    opts: &FuzzOptions,
    round: usize,
    sql: &str,
    what: &str,
    want: &[Row],
) -> Result<()> {
    for (backend, ctx) in contexts {
        trace_query(round, backend, sql);
        let got = collect(ctx, sql)
            .await
            .map_err(|e| list_mismatch(opts, round, backend, sql, what, &format!("error: {e}")))?;
        if got != want {
            let first = got
                .iter()
                .zip(want)
                .find(|(p, q)| p != q)
                .map(|(p, q)| format!(": got {p:?}, expected {q:?}"))
                .unwrap_or_default();
            let how = format!("{} rows, expected {}{first}", got.len(), want.len());
            return Err(list_mismatch(opts, round, backend, sql, what, &how));
        }
    }
    Ok(())
}

fn list_mismatch(opts: &FuzzOptions, round: usize, backend: &str, sql: &str, what: &str, how: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "fuzz mismatch (seed {}, round {round}, backend {backend}): {how}\nquery: {sql}\n{what} (drawn in Rust, not SQL)\nreproduce: setfusion fuzz --seed {} --queries {} --max-rows {}",
        opts.seed,
        opts.seed,
        round * 20,
        opts.max_rows
    ))
}

// ---------------------------------------------------------------- tables read from Parquet

/// How a round's tables are read when they come from Parquet files written
/// for the round (one round in three): the scans, their statistics, page
/// indexes and bloom filters then prune with the dynamic filters setfusion's
/// operators publish, the row-range reads of similarity joins and families
/// run, and on a GPU the device scan decodes them. Small row groups and pages
/// give the pruning something to prune.
#[derive(Debug, Clone)]
struct ParquetLayout {
    /// Files per table (rows dealt out in runs).
    files: usize,
    /// Rows a row group and a page holds (at most; a large table gets larger ones).
    row_group_rows: usize,
    page_rows: usize,
    /// Statistics of strings and binaries cut to this many bytes.
    truncate: Option<usize>,
    bloom_filters: bool,
    /// Rows sorted by the first column (ascending, NULLs last) and the files
    /// declared so (`file_sort_order`): plans may then keep that order instead of sorting.
    sorted: bool,
    /// `datafusion.execution.parquet.pushdown_filters`: row-level filtering.
    pushdown_filters: bool,
    target_partitions: usize,
}

impl ParquetLayout {
    /// None (the tables stay in memory) two rounds in three.
    fn draw(rng: &mut StdRng) -> Option<Self> {
        (rng.random_range(0..3) == 0).then(|| ParquetLayout {
            files: rng.random_range(1..=3),
            row_group_rows: [1, 3, 16, 100, 1 << 20][rng.random_range(0..5)],
            page_rows: [1, 2, 8, 1 << 20][rng.random_range(0..4)],
            truncate: rng.random_bool(0.3).then(|| rng.random_range(1..4)),
            bloom_filters: rng.random_bool(0.5),
            sorted: rng.random_bool(0.3),
            pushdown_filters: rng.random_bool(0.5),
            target_partitions: rng.random_range(1..=4),
        })
    }

    fn settings(&self) -> Vec<String> {
        vec![
            format!("SET datafusion.execution.parquet.pushdown_filters = {}", self.pushdown_filters),
            format!("SET datafusion.execution.target_partitions = {}", self.target_partitions),
        ]
    }

    fn describe(&self) -> String {
        format!("read from Parquet files under {}: {self:?}", fuzz_dir().display())
    }

    /// Writes `batch` as the files of `dir/name/` (the folder is emptied first).
    fn write(&self, dir: &std::path::Path, name: &str, batch: &RecordBatch) -> Result<std::path::PathBuf> {
        use datafusion::arrow::compute::{sort_to_indices, take_record_batch, SortOptions};
        let sorted;
        let batch = if self.sorted && batch.num_columns() > 0 {
            let order = SortOptions { descending: false, nulls_first: false };
            sorted = take_record_batch(batch, &sort_to_indices(batch.column(0), Some(order), None)?)?;
            &sorted
        } else {
            batch
        };
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::file::properties::WriterProperties;
        let folder = dir.join(name);
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder)?;
        let rows = batch.num_rows();
        let per_file = rows.div_ceil(self.files).max(1);
        // Parquet allows 32,767 row groups a file; a large table gets larger ones (and pages).
        let row_group_rows = self.row_group_rows.max(per_file.div_ceil(4096));
        let page_rows = self.page_rows.max(row_group_rows / 256);
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(row_group_rows))
            .set_data_page_row_count_limit(page_rows)
            .set_write_batch_size(page_rows.min(1024))
            .set_statistics_truncate_length(self.truncate)
            .set_bloom_filter_enabled(self.bloom_filters)
            .build();
        for f in 0..self.files {
            let (from, to) = ((f * per_file).min(rows), ((f + 1) * per_file).min(rows));
            // Every file exists, an empty one too: a table of no rows still has its schema.
            if from == to && f > 0 {
                break;
            }
            let file = std::fs::File::create(folder.join(format!("part-{f}.parquet")))?;
            let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))?;
            w.write(&batch.slice(from, to - from))?;
            w.close()?;
        }
        Ok(folder)
    }
}

/// A round's tables when they are read from Parquet: the layout, and the
/// folder each table was written to (once per round, read by every context).
struct ParquetTables {
    layout: ParquetLayout,
    /// Each table's name, folder and first column (the sorted layout's order).
    folders: Vec<(String, std::path::PathBuf, Option<String>)>,
}

impl ParquetTables {
    /// Writes `tables` under this process's folder of the fuzz (reused by every round).
    fn write(layout: ParquetLayout, tables: &[(&str, &RecordBatch)]) -> Result<Self> {
        let dir = fuzz_dir();
        let folders = tables
            .iter()
            .map(|(name, batch)| {
                let first = batch.schema().fields().first().map(|f| f.name().clone());
                Ok((name.to_string(), layout.write(&dir, name, batch)?, first))
            })
            .collect::<Result<_>>()?;
        Ok(ParquetTables { layout, folders })
    }

    /// The layout's settings, then the tables registered from their files.
    async fn register(&self, ctx: &SessionContext) -> Result<()> {
        for s in self.layout.settings() {
            ctx.sql(&s).await?.collect().await?;
        }
        for (name, folder, first) in &self.folders {
            let mut opts = datafusion::prelude::ParquetReadOptions::default();
            if let Some(first) = first.as_ref().filter(|_| self.layout.sorted) {
                opts.file_sort_order = vec![vec![datafusion::prelude::col(first.as_str()).sort(true, false)]];
            }
            ctx.register_parquet(name.as_str(), &format!("{}/", folder.display()), opts).await?;
        }
        Ok(())
    }
}

/// This process's folder of the fuzz's Parquet files (rewritten by every
/// Parquet round, removed when the run ends).
fn fuzz_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("setfusion-fuzz-{}", std::process::id()))
}

/// A SQL-made table of `plain` as one batch (its schema where it has no rows).
async fn table_batch(plain: &SessionContext, name: &str) -> Result<RecordBatch> {
    let df = plain.table(name).await?;
    let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    Ok(datafusion::arrow::compute::concat_batches(&schema, &batches)?)
}
