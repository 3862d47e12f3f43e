//! setfusion on a Ballista cluster (issue 17): a scheduler and two executors
//! in this process on loopback ports run the demo queries (INTERSECT ALL,
//! EXCEPT ALL, INTERSECT, IN, NOT IN, IN under OR (a mark join), a similarity
//! join) over Parquet files
//! split into several partitions, and every answer equals one process's; the
//! scheduler's plan holds setfusion's operators with both inputs shuffled by key.
//! Each query runs with setfusion's automatic choice, with
//! `setfusion.strategy = 'cpu'`, which puts setfusion's operators in place of
//! DataFusion's semi / anti joins on a machine without a GPU too, and with
//! `'hash'`, which sends them to the executors' GPU: on a machine with one
//! (the executors share this process's device), the device must have been
//! leased while those queries ran; without one they fall back to the CPU.

use datafusion::prelude::SessionConfig;
use setfusion_ballista::{demo, remote_context, start_loopback_cluster};

#[test]
fn loopback_cluster_answers_like_one_process() {
    // The executors lease this process's device (`'hash'` below), so the test
    // holds it beside the others (see `common::shared_device`); the cluster
    // runs on a runtime of its own, stopped before the device is let go.
    let _device = crate::common::shared_device();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("tokio runtime");
    runtime.block_on(loopback_cluster());
}

async fn loopback_cluster() {
    let dir = std::env::temp_dir().join(format!("setfusion-ballista-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    demo::write_tables(&dir, 6000).await.unwrap();
    let url = start_loopback_cluster(2, 2).await.unwrap();
    let gpu = setfusion::gpu::test_gpu();
    for settings in [&[][..], &["SET setfusion.strategy = 'cpu'"][..], &["SET setfusion.strategy = 'hash'"][..]] {
        let config = || SessionConfig::new().with_target_partitions(4);
        let cluster = remote_context(&url, config()).await.unwrap();
        let local = setfusion::context_with_config(config());
        for ctx in [&cluster, &local] {
            for s in settings {
                ctx.sql(s).await.unwrap().collect().await.unwrap();
            }
            demo::register_tables(ctx, &dir).await.unwrap();
        }
        if settings == ["SET setfusion.strategy = 'cpu'"] {
            // The scheduler's plan (Ballista's EXPLAIN shows the stages): setfusion's operators,
            // the set operation and the semi join with both inputs shuffled by key.
            for (sql, wants) in [
                (
                    "SELECT k FROM r INTERSECT ALL SELECT k FROM t",
                    &["SetOpExec: op=intersect all", ", partitioned", "partitioning=Hash([k@0], 4)"][..],
                ),
                (
                    "SELECT a.id, b.id FROM docs_a a JOIN docs_b b ON jaccard(a.elements, b.elements) >= 0.8",
                    &["SimilarityJoinExec"][..],
                ),
                // The client's SET reaches the scheduler (the reason), and the semi join is setfusion's
                // (Ballista plans a sort-merge join, which the rule replaces like a hash join).
                // Ballista rewrites NOT IN (an anti join beside the subquery's row and NULL counts).
                (
                    "SELECT k, v FROM r WHERE k NOT IN (SELECT k FROM t)",
                    &["SemiJoinExec: op=anti", "__ballista_not_in"][..],
                ),
                (
                    "SELECT k, v FROM r WHERE k IN (SELECT k FROM t)",
                    &["SemiJoinExec: op=semi", "setfusion.strategy = cpu", "partitioning=Hash([k@0], 4)"][..],
                ),
                // The mark join broadcasts its subquery side; its probe side stays partitioned.
                (
                    "SELECT k, v, k IN (SELECT k FROM t) OR v > 990 AS m FROM r",
                    &["MarkJoinExec: kind=in", "subquery=broadcast"][..],
                ),
            ] {
                let batches = cluster.sql(&format!("EXPLAIN {sql}")).await.unwrap().collect().await.unwrap();
                let explain = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
                let stages = explain
                    .split("distributed_plan")
                    .nth(1)
                    .unwrap_or_else(|| panic!("{sql}: no distributed plan in\n{explain}"));
                for want in wants {
                    assert!(stages.contains(want), "{sql}: no {want} in the cluster's plan\n{stages}");
                }
            }
        }
        let mut wants = Vec::new();
        for (name, sql) in demo::QUERIES {
            let want = demo::sorted_rows(&local, sql).await.unwrap();
            assert!(!want.is_empty(), "{name}: the data gives an empty answer");
            wants.push(want);
        }
        // Counted from here: only the cluster's queries run below.
        let leases_before = gpu.as_ref().map(|g| g.leases());
        for ((name, sql), want) in demo::QUERIES.iter().zip(wants) {
            let got = demo::sorted_rows(&cluster, sql)
                .await
                .unwrap_or_else(|e| panic!("{name} {settings:?} on the cluster: {e}"));
            assert_eq!(got.len(), want.len(), "{name} {settings:?}: row counts");
            assert_eq!(got, want, "{name} {settings:?}");
        }
        if let (Some(g), Some(before), ["SET setfusion.strategy = 'hash'"]) = (&gpu, leases_before, settings) {
            assert!(g.leases() > before, "strategy 'hash' on the cluster: the executors never leased the GPU");
            println!("ballista: the executors leased the GPU {} times under strategy 'hash'", g.leases() - before);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
