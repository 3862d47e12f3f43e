//! setfusion's operators in DataFusion's plans (issue 28 item 3): they publish
//! the dynamic filter DataFusion's hash join would into the Parquet scan of
//! the input they may prune (and only where that is exact), and they absorb
//! a LIMIT as a fetch.
//!
//! Each query runs on setfusion's CPU backend (`strategy = cpu`, so the
//! operators are planned without a GPU) with the join dynamic filter on and
//! off, and in plain DataFusion: the answers agree, and the scan's pruning
//! metrics show what the filter pruned.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::common::block_on;

/// probe.parquet: k = 0..100,000 (10 row groups of 10,000 rows, k ascending),
/// v = k % 7, n = k or NULL for every 1,000th row; built.parquet: b in a
/// narrow range plus a few scattered keys. Both written by DataFusion's COPY.
async fn tables(ctx: &SessionContext, dir: &std::path::Path) {
    static WRITTEN: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let probe = dir.join("probe.parquet");
    let build = dir.join("build.parquet");
    let mut written = WRITTEN.lock().await;
    if !*written {
        *written = true;
        let writer = SessionContext::new();
        let copy = |sql: String| {
            let writer = writer.clone();
            async move { writer.sql(&sql).await.unwrap().collect().await.unwrap() }
        };
        copy(format!(
            "COPY (SELECT value AS k, value % 7 AS v, CASE WHEN value % 1000 = 0 THEN NULL ELSE value END AS n \
             FROM generate_series(0, 99999) ORDER BY value) TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '10000')",
            probe.display()
        ))
        .await;
        copy(format!(
            "COPY (SELECT value + 20000 AS b, CASE WHEN value = 3 THEN NULL ELSE value + 20000 END AS nb FROM generate_series(0, 40)) TO '{}' STORED AS PARQUET",
            build.display()
        ))
        .await;
    }
    for (name, path) in [("probe", &probe), ("build", &build)] {
        ctx.sql(&format!("CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{}'", path.display()))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
    }
}

fn scratch() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("setfusion-citizenship-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A session: setfusion on its CPU backend, or plain DataFusion; the join dynamic filter on or off.
async fn session(setfusion: bool, dynamic_filter: bool) -> SessionContext {
    let config = SessionConfig::new().with_target_partitions(4);
    let ctx = if setfusion { setfusion::context_with_config(config) } else { SessionContext::new_with_config(config) };
    if setfusion {
        ctx.sql("SET setfusion.strategy = 'cpu'").await.unwrap().collect().await.unwrap();
    }
    ctx.sql(&format!("SET datafusion.optimizer.enable_join_dynamic_filter_pushdown = {dynamic_filter}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    tables(&ctx, &scratch()).await;
    ctx
}

/// The query's sorted rows (as text), its executed plan.
async fn run(ctx: &SessionContext, sql: &str) -> (Vec<String>, Arc<dyn ExecutionPlan>) {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let task = Arc::new(df.task_ctx());
    let plan = df.create_physical_plan().await.unwrap();
    let batches: Vec<RecordBatch> = collect(plan.clone(), task).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let text = pretty_format_batches(&batches).unwrap().to_string();
    let mut rows: Vec<String> = text.lines().skip(3).filter(|l| !l.starts_with('+')).map(str::to_string).collect();
    rows.sort();
    (rows, plan)
}

/// Sum of a pruning metric (pruned count) over every node of `plan`.
fn pruned(plan: &Arc<dyn ExecutionPlan>, metric: &str) -> usize {
    let mut total = 0;
    let mut stack = vec![plan.clone()];
    while let Some(p) = stack.pop() {
        if let Some(m) = p.metrics() {
            for v in m.iter() {
                if let MetricValue::PruningMetrics { name, pruning_metrics } = v.value() {
                    if name == metric {
                        total += pruning_metrics.pruned();
                    }
                }
            }
        }
        stack.extend(p.children().into_iter().cloned());
    }
    total
}

fn plan_text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

/// The query on setfusion with the dynamic filter on and off and on plain DataFusion:
/// the same rows; returns setfusion's plan with the filter on and the row groups it pruned.
async fn compare(sql: &str) -> (String, usize, usize) {
    let (with_filter, plan) = run(&session(true, true).await, sql).await;
    let (without, plan_off) = run(&session(true, false).await, sql).await;
    assert_eq!(with_filter, without, "{sql}: setfusion with and without the dynamic filter");
    // DataFusion's INTERSECT ALL / EXCEPT ALL keep every copy of a matching row (not SQL's
    // min(m, n) / max(m - n, 0)): there setfusion without the filter is the reference.
    if !sql.contains(" ALL ") {
        let (plain, _) = run(&session(false, true).await, sql).await;
        assert_eq!(with_filter, plain, "{sql}: setfusion with the dynamic filter vs plain DataFusion");
    }
    let off = pruned(&plan_off, "row_groups_pruned_statistics");
    (plan_text(&plan), pruned(&plan, "row_groups_pruned_statistics"), off)
}

/// IN / EXISTS (semi joins) and INTERSECT prune the kept side's row groups
/// with the other side's key bounds (and IN list); the answers do not change.
#[test]
fn semi_join_and_intersect_publish_exact_filters() {
    let _device = crate::common::shared_device();
    block_on(|| async {
        // (query, row groups the filter must prune): the build keys lie in 20,000..20,040, so
        // only the third row group can hold them; but where NULLs are equal (INTERSECT) and
        // the build side holds a NULL, every probe row with a NULL key must stay, and every
        // row group holds some (n is NULL every 1,000th row): `n IS NULL OR ...` prunes none.
        for (sql, prunes) in [
            ("SELECT k, v FROM probe WHERE k IN (SELECT b FROM build)", 9),
            ("SELECT k FROM probe WHERE EXISTS (SELECT 1 FROM build WHERE build.b = probe.k)", 9),
            ("SELECT k FROM probe WHERE n IN (SELECT nb FROM build)", 9),
            ("SELECT k FROM probe INTERSECT SELECT b FROM build", 9),
            ("SELECT n FROM probe INTERSECT SELECT b FROM build", 9),
            ("SELECT n FROM probe INTERSECT SELECT nb FROM build", 0),
            ("SELECT n FROM probe INTERSECT ALL SELECT nb FROM build", 0),
        ] {
            let (plan, pruned_on, pruned_off) = compare(sql).await;
            assert!(plan.contains("dynamic_filter=probe"), "{sql}: no dynamic filter in\n{plan}");
            assert!(plan.contains("DynamicFilter"), "{sql}: the scan shows no dynamic filter in\n{plan}");
            if prunes > 0 {
                assert!(pruned_on >= prunes, "{sql}: {pruned_on} row groups pruned with the filter\n{plan}");
            } else {
                assert_eq!(pruned_on, 0, "{sql}: row groups with NULL keys pruned\n{plan}");
            }
            assert_eq!(pruned_off, 0, "{sql}: row groups pruned without the filter");
        }
    });
}

/// NOT IN / NOT EXISTS / EXCEPT never prune the kept side (its unmatched rows
/// are the answer): their filter, where exact, goes to the other side.
#[test]
fn anti_join_and_except_never_prune_kept_rows() {
    let _device = crate::common::shared_device();
    block_on(|| async {
        for sql in [
            "SELECT b FROM build WHERE b NOT IN (SELECT k FROM probe WHERE k < 20010)",
            "SELECT b FROM build WHERE NOT EXISTS (SELECT 1 FROM probe WHERE probe.k = build.b)",
            "SELECT nb FROM build EXCEPT SELECT n FROM probe",
            "SELECT b FROM build EXCEPT SELECT n FROM probe",
            "SELECT nb FROM build EXCEPT ALL SELECT n FROM probe",
            "SELECT k FROM probe WHERE k NOT IN (SELECT b FROM build)",
            "SELECT n FROM probe WHERE n NOT IN (SELECT nb FROM build)",
            "SELECT k FROM probe EXCEPT SELECT b FROM build",
        ] {
            let (plan, pruned_on, _) = compare(sql).await;
            assert!(!plan.contains("dynamic_filter=probe"), "{sql}: the kept side is filtered in\n{plan}");
            if sql.starts_with("SELECT k FROM probe") || sql.starts_with("SELECT n FROM probe") {
                assert_eq!(pruned_on, 0, "{sql}: kept row groups pruned\n{plan}");
            } else if !sql.contains("NOT IN") {
                // The (large) other side is pruned to the kept keys' range, except where the kept
                // side's NULL (nb) must meet the other side's NULLs (EXCEPT: NULLs are equal).
                assert!(plan.contains("dynamic_filter=build"), "{sql}: no dynamic filter in\n{plan}");
                let prunes = if sql.contains("nb FROM build EXCEPT") { 0 } else { 9 };
                assert!(pruned_on >= prunes, "{sql}: {pruned_on} row groups pruned\n{plan}");
            }
        }
    });
}

/// A LIMIT over the operators is absorbed as their fetch: no GlobalLimitExec
/// right above them, each partition stops after `fetch` rows, the answer is
/// a right number of matching rows.
#[test]
fn operators_accept_a_fetch() {
    let _device = crate::common::shared_device();
    block_on(|| async {
        let ctx = session(true, true).await;
        ctx.sql("SET datafusion.execution.target_partitions = 1").await.unwrap().collect().await.unwrap();
        for (sql, fetch) in [
            ("SELECT k FROM probe WHERE k IN (SELECT b FROM build) LIMIT 5", 5),
            ("SELECT k FROM probe WHERE k NOT IN (SELECT b FROM build) LIMIT 7", 7),
            ("SELECT k FROM probe INTERSECT ALL SELECT b FROM build LIMIT 3", 3),
            ("SELECT k, k IN (SELECT b FROM build) OR v = 1 AS m FROM probe LIMIT 4", 4),
        ] {
            let (rows, plan) = run(&ctx, sql).await;
            let text = plan_text(&plan);
            assert_eq!(rows.len(), fetch, "{sql}\n{text}");
            let operator = text
                .lines()
                .find(|l| l.contains("SemiJoinExec") || l.contains("SetOpExec") || l.contains("MarkJoinExec"));
            let operator = operator.unwrap_or_else(|| panic!("{sql}: no setfusion operator in\n{text}"));
            assert!(operator.contains(&format!("fetch={fetch}")), "{sql}: no fetch in\n{text}");
            assert!(!text.contains("GlobalLimitExec"), "{sql}: a GlobalLimitExec is left in\n{text}");
        }
        // Every partition stops at its fetch.
        ctx.sql("SET datafusion.execution.target_partitions = 4").await.unwrap().collect().await.unwrap();
        let (rows, plan) = run(&ctx, "SELECT k FROM probe WHERE k IN (SELECT b FROM build) LIMIT 6").await;
        assert_eq!(rows.len(), 6, "{}", plan_text(&plan));
    });
}
