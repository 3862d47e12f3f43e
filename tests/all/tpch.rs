//! TPC-H (SF 0.1, generated in-process as Parquet with tpchgen-arrow) with
//! every setfusion operator forced: the 22 queries and the semi / anti join
//! queries must give DataFusion's own answers, the set operations their exact
//! multiset answers (computed from the two sides: DataFusion gets the ALL
//! forms wrong). Run with 2 and 4 target partitions in cpu mode (strategy =
//! cpu, min_rows = 0: a rewrite that breaks a plan property fails here, as
//! Q20 did), in gpu mode (min_rows = 0) where a GPU is usable, and with
//! default settings (the cost model's choices).

use std::path::PathBuf;

use datafusion::prelude::SessionContext;
use setfusion_tools::bench::tpch::{self, canonical_rows, expected_set_op, JOIN_QUERIES, QUERIES, SET_QUERIES};

use crate::common::{block_on, gpu_or_skip};

fn data() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("setfusion-tpch-test-{}", std::process::id())).join("sf0.1");
        tpch::generate(0.1, &dir).expect("generate TPC-H SF 0.1");
        dir
    })
    .clone()
}

async fn rows(ctx: &SessionContext, sql: &str, what: &str) -> Vec<String> {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{what}: planning {sql}: {e}"));
    let batches = df.collect().await.unwrap_or_else(|e| panic!("{what}: running {sql}: {e}"));
    canonical_rows(&batches).unwrap()
}

/// Count the setfusion operators in a query's physical plan.
async fn setfusion_operators(ctx: &SessionContext, sql: &str) -> usize {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
    text.lines().filter(|l| l.contains("SemiJoinExec") || l.contains("SetOpExec") || l.contains("MarkJoinExec")).count()
}

#[test]
fn tpch_answers_with_setfusion_forced() {
    let _device = crate::common::shared_device();
    let gpu = gpu_or_skip().is_ok();
    let dir = data();
    block_on(move || async move {
        let plain = tpch::session(&dir, false, 4, &[]).await.unwrap();
        let mut modes = Vec::new();
        for partitions in [2, 4] {
            let ctx = tpch::session(
                &dir,
                true,
                partitions,
                &["SET setfusion.strategy = 'cpu'", "SET setfusion.min_rows = 0"],
            )
            .await
            .unwrap();
            modes.push((format!("cpu, {partitions} partitions"), ctx));
        }
        if gpu {
            let ctx = tpch::session(&dir, true, 4, &["SET setfusion.min_rows = 0"]).await.unwrap();
            modes.push(("gpu, 4 partitions".into(), ctx));
        }
        // Default settings: the cost model's choices (here mostly DataFusion's own
        // operators, rebuilt by setfusion's planner for INTERSECT / EXCEPT).
        let default = tpch::session(&dir, true, 4, &[]).await.unwrap();
        modes.push(("default settings".into(), default));
        let mut offloaded = 0;
        for (name, sql) in QUERIES.iter().chain(JOIN_QUERIES.iter()) {
            let want = rows(&plain, sql, "DataFusion").await;
            for (mode, ctx) in &modes {
                let got = rows(ctx, sql, &format!("{name} ({mode})")).await;
                assert_eq!(got.len(), want.len(), "{name} ({mode}): row count");
                assert!(got == want, "{name} ({mode}): answer differs from DataFusion's");
            }
            offloaded += setfusion_operators(&modes[0].1, sql).await;
        }
        // Q4, Q16, Q18, Q20, Q21, Q22 and the two join queries hold semi / anti joins setfusion takes.
        assert!(offloaded >= 8, "only {offloaded} setfusion operators in the forced plans");
        for q in SET_QUERIES {
            let left = rows(&plain, q.left, "left side").await;
            let right = rows(&plain, q.right, "right side").await;
            let want = expected_set_op(q.op, &left, &right);
            assert!(!want.is_empty(), "{}: empty expected answer (a weak test)", q.name);
            for (mode, ctx) in &modes {
                let got = rows(ctx, &q.sql(), &format!("{} ({mode})", q.name)).await;
                assert_eq!(got.len(), want.len(), "{} ({mode}): row count", q.name);
                assert!(got == want, "{} ({mode}): answer differs from the exact multiset answer", q.name);
                if mode != "default settings" {
                    assert_eq!(
                        setfusion_operators(ctx, &q.sql()).await,
                        1,
                        "{} ({mode}): not a setfusion operator",
                        q.name
                    );
                }
            }
        }
        println!(
            "tpch: 22 queries + {} join + {} set-operation queries agree ({})",
            JOIN_QUERIES.len(),
            SET_QUERIES.len(),
            modes.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>().join("; ")
        );
    });
    let _ = std::fs::remove_dir_all(data().parent().unwrap());
}
