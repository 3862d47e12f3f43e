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
