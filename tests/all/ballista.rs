//! setfusion on a Ballista cluster (issue 17): a scheduler and two executors
//! in this process on loopback ports run the demo queries (INTERSECT ALL,
//! EXCEPT ALL, INTERSECT, IN, NOT IN, IN under OR (a mark join), a similarity
//! join) over Parquet files
//! split into several partitions, and every answer equals one process's; the
//! scheduler's plan holds setfusion's operators with both inputs shuffled by key.
//! Each query runs with setfusion's automatic choice and with
//! `setfusion.strategy = 'cpu'`, which puts setfusion's operators in place of
//! DataFusion's semi / anti joins on a machine without a GPU too.

use datafusion::prelude::SessionConfig;
use setfusion::distributed::{demo, remote_context, start_loopback_cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loopback_cluster_answers_like_one_process() {
    let dir = std::env::temp_dir().join(format!("setfusion-ballista-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    demo::write_tables(&dir, 6000).await.unwrap();
    let url = start_loopback_cluster(2, 2).await.unwrap();
    for settings in [&[][..], &["SET setfusion.strategy = 'cpu'"][..]] {
        let config = || SessionConfig::new().with_target_partitions(4);
        let cluster = remote_context(&url, config()).await.unwrap();
        let local = setfusion::context_with_config(config());
        for ctx in [&cluster, &local] {
            for s in settings {
                ctx.sql(s).await.unwrap().collect().await.unwrap();
            }
            demo::register_tables(ctx, &dir).await.unwrap();
        }
        if !settings.is_empty() {
            // The scheduler's plan (Ballista's EXPLAIN shows the stages): setfusion's operators,
            // the set operation and the semi join with both inputs shuffled by key.
            for (sql, wants) in [
                ("SELECT k FROM r INTERSECT ALL SELECT k FROM t", &["SetOpExec: op=intersect all", ", partitioned", "partitioning=Hash([k@0], 4)"][..]),
                ("SELECT a.id, b.id FROM docs_a a JOIN docs_b b ON jaccard(a.elements, b.elements) >= 0.8", &["SimilarityJoinExec"][..]),
            ] {
                let batches = cluster.sql(&format!("EXPLAIN {sql}")).await.unwrap().collect().await.unwrap();
                let explain = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
                let stages = explain.split("distributed_plan").nth(1).unwrap_or_else(|| panic!("{sql}: no distributed plan in\n{explain}"));
                for want in wants {
                    assert!(stages.contains(want), "{sql}: no {want} in the cluster's plan\n{stages}");
                }
            }
        }
        for (name, sql) in demo::QUERIES {
            let want = demo::sorted_rows(&local, sql).await.unwrap();
            assert!(!want.is_empty(), "{name}: the data gives an empty answer");
            let got = demo::sorted_rows(&cluster, sql).await.unwrap_or_else(|e| panic!("{name} {settings:?} on the cluster: {e}"));
            assert_eq!(got.len(), want.len(), "{name} {settings:?}: row counts");
            assert_eq!(got, want, "{name} {settings:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
