//! Randomized differential test: `setfusion fuzz` in small (the generator and
//! the reference evaluator live in `src/fuzz.rs`, shared with the CLI's long run).

use crate::common::{block_on, gpu_or_skip};

/// `setfusion fuzz` in small: random tables (up to 50,000 rows) and random
/// set operations, semi / anti joins and subquery predicates in every boolean
/// context, on the CPU backend and every GPU strategy where a GPU is usable,
/// against the fuzz's reference evaluator. `SETFUSION_FUZZ_QUERIES` sets the
/// number (default 600); `setfusion fuzz --queries 10000` is the long run.
#[test]
fn fuzz_small_run_agrees() {
    let _device = crate::common::shared_device();
    let queries: usize = setfusion_tools::env::fuzz_queries().unwrap_or(600);
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let opts = setfusion_tools::fuzz::FuzzOptions { queries, seed: 20261124, max_rows: 50_000, gpu };
        match setfusion_tools::fuzz::run(&opts).await {
            Ok(r) => println!(
                "fuzz: {} queries in {} rounds agree on {} ({} refused by plain DataFusion and setfusion alike)",
                r.queries,
                r.rounds,
                r.backends.join(", "),
                r.refused
            ),
            Err(e) => panic!("{e}"),
        }
    });
}

/// `intersect_families` against DataFusion's own `array_intersect` over a
/// cross join (distinct-only, which equals a set intersection here: the
/// lists hold no NULL elements): random tables with NULL lists, empty lists,
/// repeats inside lists and repeated rows, elements in a dense range and
/// spread over all of BIGINT (the operator's two domain mappings), at the
/// pairs and distinct levels, two tables and the self form, on the CPU
/// backend and (where a GPU is usable) the GPU backend.
#[test]
fn families_match_array_intersect() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let mut next = setfusion::algo::families::tests_data::xorshift(0x5eed);
        for round in 0..6 {
            let spread = round % 2 == 1;
            let mut table = |name: &str, rows: usize| {
                let mut values = Vec::new();
                for r in 0..rows {
                    let list = if next() % 10 == 0 {
                        "NULL".to_string()
                    } else {
                        let len = next() % 7;
                        let els: Vec<String> = (0..len)
                            .map(|_| {
                                let v = (next() % 25) as i64;
                                if spread {
                                    (v * 350_000_000_000_000_007 % i64::MAX)
                                        .wrapping_mul(if v % 2 == 0 { 1 } else { -1 })
                                        .to_string()
                                } else {
                                    v.to_string()
                                }
                            })
                            .collect();
                        format!("[{}]", els.join(", "))
                    };
                    // Some ids repeat (repeated rows or different sets under one id).
                    values.push(format!("({}, {list})", if next() % 8 == 0 { 0 } else { r as u64 }));
                }
                format!("CREATE TABLE {name}(id BIGINT, elements BIGINT[]) AS VALUES {}", values.join(", "))
            };
            let (f, g) = (table("f", 40 + round * 5), table("g", 30));
            let modes: &[&str] = if gpu {
                &["SET setfusion.strategy = 'cpu'", "SET setfusion.min_rows = 0"]
            } else {
                &["SET setfusion.strategy = 'cpu'"]
            };
            for mode in modes {
                let ctx = setfusion::context();
                for stmt in [f.as_str(), g.as_str(), mode] {
                    ctx.sql(stmt).await.unwrap().collect().await.unwrap();
                }
                let rows = |sql: String| {
                    let ctx = ctx.clone();
                    async move {
                        let batches =
                            ctx.sql(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).collect().await.unwrap();
                        let mut out: Vec<String> = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                            .unwrap()
                            .to_string()
                            .lines()
                            .filter(|l| l.starts_with("| "))
                            .skip(1)
                            // Cells only: column widths follow the headers.
                            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>().join("|"))
                            .collect();
                        out.sort();
                        out
                    }
                };
                let reference = |self_form: bool| {
                    let (right, cond) = if self_form { ("f", "AND a.id < b.id") } else { ("g", "") };
                    format!(
                        "SELECT a.id AS l, b.id AS r, array_sort(array_intersect(a.elements, b.elements)) AS e FROM f a, {right} b \
                         WHERE cardinality(array_intersect(a.elements, b.elements)) > 0 {cond}"
                    )
                };
                for self_form in [false, true] {
                    let args = if self_form { "'f'" } else { "'f', 'g'" };
                    let got =
                        rows(format!("SELECT left_id, right_id, elements FROM intersect_families({args}, 'pairs')"))
                            .await;
                    let want = rows(format!("SELECT l, r, e FROM ({})", reference(self_form))).await;
                    assert_eq!(got, want, "round {round}, {mode}, pairs, self form {self_form}");
                    let got = rows(format!("SELECT elements, frequency FROM intersect_families({args})")).await;
                    let want = rows(format!("SELECT e, count(*) FROM ({}) GROUP BY e", reference(self_form))).await;
                    assert_eq!(got, want, "round {round}, {mode}, distinct, self form {self_form}");
                }
            }
        }
    });
}

/// Float keys compare as DataFusion compares floats: -0.0 = 0.0, a NaN equals
/// only a NaN of the same bits ('NaN' and the NaN with the sign bit differ),
/// the NaN with the sign bit is below every number and 'NaN' above. Every
/// set operation, IN / NOT IN, [NOT] EXISTS and quantified comparison over
/// DOUBLE and REAL keys answers as DataFusion's own plan (setfusion off), a
/// quantified one as its SQL definition written with EXISTS (DataFusion's
/// grouped min / max follow IEEE's `<` over NaNs, which setfusion's summaries
/// must not). On the CPU backend and, where a GPU is usable, with
/// `min_rows = 0` under each strategy.
#[test]
fn float_keys_answer_as_datafusion() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let specials =
            ["0.0", "-0.0", "CAST('NaN' AS DOUBLE)", "-CAST('NaN' AS DOUBLE)", "CAST('inf' AS DOUBLE)", "1.5"];
        let table = |name: &str, ty: &str, pick: &[usize]| {
            let rows: Vec<String> = pick
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let v = if p == specials.len() { "NULL".to_string() } else { specials[p].to_string() };
                    format!("({}, CAST({v} AS {ty}))", i % 3)
                })
                .collect();
            format!("CREATE TABLE {name}(g INT, x {ty}) AS VALUES {}", rows.join(", "))
        };
        let queries = [
            "SELECT x FROM a INTERSECT SELECT x FROM b",
            "SELECT x FROM a EXCEPT SELECT x FROM b",
            "SELECT x FROM a INTERSECT ALL SELECT x FROM b",
            "SELECT x FROM a EXCEPT ALL SELECT x FROM b",
            "SELECT g, x FROM a WHERE x IN (SELECT x FROM b)",
            "SELECT g, x FROM a WHERE x NOT IN (SELECT x FROM b WHERE x IS NOT NULL)",
            "SELECT g, x FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.x = a.x AND b.g = a.g)",
            "SELECT g, x FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.x = a.x)",
            "SELECT g, x FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.g = a.g AND a.x < b.x)",
        ];
        // A quantified comparison in WHERE, and its definition over EXISTS (TRUE rows only).
        let quantified = [
            ("x > ANY (SELECT x FROM b WHERE b.g = a.g)", "EXISTS (SELECT 1 FROM b WHERE b.g = a.g AND a.x > b.x)"),
            (
                "NOT (x >= ALL (SELECT x FROM b WHERE b.g = a.g))",
                "EXISTS (SELECT 1 FROM b WHERE b.g = a.g AND a.x < b.x)",
            ),
            ("x <= ANY (SELECT x FROM b)", "EXISTS (SELECT 1 FROM b WHERE a.x <= b.x)"),
            (
                "NOT (x = ALL (SELECT x FROM b WHERE b.g = a.g))",
                "EXISTS (SELECT 1 FROM b WHERE b.g = a.g AND a.x <> b.x)",
            ),
        ];
        let mut settings: Vec<Vec<String>> = vec![vec!["SET setfusion.strategy = 'cpu'".to_string()]];
        if gpu {
            for s in ["auto", "hash", "bitmap", "sort"] {
                settings
                    .push(vec!["SET setfusion.min_rows = 0".to_string(), format!("SET setfusion.strategy = '{s}'")]);
            }
        }
        let mut next = setfusion::algo::families::tests_data::xorshift(0xf10a7);
        for round in 0..8 {
            let ty = if round % 2 == 0 { "DOUBLE" } else { "REAL" };
            let mut pick =
                |n: usize| -> Vec<usize> { (0..n).map(|_| (next() % (specials.len() as u64 + 1)) as usize).collect() };
            let (pa, pb) = (pick(12 + round), pick(9 + round));
            let setup = [table("a", ty, &pa), table("b", ty, &pb)];
            let plain = setfusion::context();
            for s in ["SET setfusion.enabled = false".to_string()].iter().chain(&setup) {
                plain.sql(s).await.unwrap().collect().await.unwrap();
            }
            // Floats shown by their order keys (-0.0 as 0.0): Arrow prints both NaNs alike.
            let show = |q: &str| {
                let group = if q.starts_with("SELECT x ") { "1" } else { "g" };
                format!("SELECT {group}, setfusion_float_order(CAST(x AS DOUBLE)) AS k FROM ({q}) ORDER BY 1, 2")
            };
            for s in &settings {
                let ctx = setfusion::context();
                for st in s.iter().chain(&setup) {
                    ctx.sql(st).await.unwrap().collect().await.unwrap();
                }
                for q in queries {
                    let sql = show(q);
                    let (got, want) = (crate::common::rows(&ctx, &sql).await, crate::common::rows(&plain, &sql).await);
                    assert_eq!(got, want, "{ty} {s:?}: {q}\na: {pa:?}\nb: {pb:?}");
                }
                for (q, definition) in quantified {
                    let sql = show(&format!("SELECT g, x FROM a WHERE {q}"));
                    let want = show(&format!("SELECT g, x FROM a WHERE {definition}"));
                    let (got, want) = (crate::common::rows(&ctx, &sql).await, crate::common::rows(&plain, &want).await);
                    assert_eq!(got, want, "{ty} {s:?}: {q}\na: {pa:?}\nb: {pb:?}");
                }
            }
        }
    });
}

/// Top-level EXISTS / IN whose subquery joins a correlated derived table
/// with another reading the same table under new names: DataFusion 55's
/// decorrelation fails on them ("No field named y.c1"); setfusion takes them
/// as mark joins and answers as SQL's rules say (answers written by hand).
#[test]
fn subqueries_datafusion_fails_to_decorrelate_answer() {
    block_on(|| async {
        let ctx = setfusion::context();
        for s in [
            "CREATE TABLE a(c0 INT, c1 INT) AS VALUES (1, 1), (2, 2), (3, NULL)",
            "CREATE TABLE b(c0 INT, c1 INT) AS VALUES (1, 1), (2, 5), (NULL, 2)",
        ] {
            ctx.sql(s).await.unwrap().collect().await.unwrap();
        }
        let derived = "(SELECT * FROM b WHERE b.c1 = a.c1) x";
        let renamed = "(SELECT c0 AS d0, c1 AS d1 FROM b) y";
        let cases = [
            (format!("EXISTS (SELECT 1 FROM {derived} LEFT JOIN {renamed} ON x.c0 = y.d0)"), vec!["1|1", "2|2"]),
            (format!("EXISTS (SELECT 1 FROM {derived} JOIN {renamed} ON x.c0 = y.d0)"), vec!["1|1"]),
            (format!("NOT EXISTS (SELECT 1 FROM {derived} JOIN {renamed} ON x.c0 = y.d0)"), vec!["2|2", "3|NULL"]),
            (
                "a.c1 IN (SELECT x.c1 FROM (SELECT * FROM b WHERE b.c0 = a.c0) x LEFT JOIN (SELECT c0 AS d0 FROM b) y \
                 ON x.c0 = y.d0)"
                    .to_string(),
                vec!["1|1"],
            ),
        ];
        for (predicate, want) in cases {
            let q = format!("SELECT c0, c1 FROM a WHERE {predicate} ORDER BY c0");
            let got = crate::common::rows(&ctx, &q).await;
            assert_eq!(got, want, "{q}");
        }
    });
}
