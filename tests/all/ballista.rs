//! setfusion on a Ballista cluster (issue 17): a scheduler and two executors
//! in this process on loopback ports run the demo queries (INTERSECT ALL,
//! EXCEPT ALL, INTERSECT, IN, NOT IN, a similarity join) over Parquet files
//! split into several partitions, and every answer equals one process's.
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
