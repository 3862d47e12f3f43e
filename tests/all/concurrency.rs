//! Eight sessions in one process run setfusion queries at once on one device
//! (issue 16 item 8): half of them with a device budget (4 MiB) below
//! their keys (8 MiB a side), so they partition while the others do not.
//! Every answer must equal the CPU backend's, nothing may wait forever (a
//! 10-minute limit), and the device budget's use must return to where it
//! started. Without a GPU the eight sessions run the CPU backend at once.

use std::sync::Arc;
use std::time::Duration;

use datafusion::prelude::SessionConfig;
use setfusion_tools::datagen;

use crate::common::{block_on, gpu_or_skip};

const QUERIES: &[&str] = &[
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT count(*) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)",
    "SELECT count(*) FROM (SELECT k FROM a EXCEPT SELECT k FROM b)",
    "SELECT count(*) FROM a WHERE k IN (SELECT k FROM b) OR v < 10",
    "SELECT sum(CASE WHEN k IN (SELECT k FROM b WHERE k % 3 = 0) THEN 1 ELSE 0 END) FROM a",
];

async fn answers(ctx: &datafusion::prelude::SessionContext) -> Vec<String> {
    let mut out = Vec::new();
    for q in QUERIES {
        let batches = ctx
            .sql(q)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        out.push(datafusion::arrow::util::display::array_value_to_string(batches[0].column(0), 0).unwrap());
    }
    out
}

#[test]
fn eight_sessions_share_one_device() {
    let _device = crate::common::exclusive_device();
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        let n = 1_000_000;
        let a = Arc::new(datagen::key_table(n, datagen::key_a, true, 4).unwrap());
        let b = Arc::new(datagen::key_table(n, datagen::key_b, false, 4).unwrap());
        let session = |settings: Vec<&'static str>| {
            let (a, b) = (a.clone(), b.clone());
            async move {
                let ctx = setfusion::context_with_config(SessionConfig::new().with_target_partitions(4));
                ctx.register_table("a", a).unwrap();
                ctx.register_table("b", b).unwrap();
                for s in settings {
                    ctx.sql(s).await.unwrap().collect().await.unwrap();
                }
                ctx
            }
        };
        let want = answers(&session(vec!["SET setfusion.strategy = 'cpu'"]).await).await;
        let used_before = gpu.then(|| setfusion::gpu::gpu(0).unwrap().budget().used());
        let tasks: Vec<_> = (0..8)
            .map(|s| {
                let settings = match (gpu, s % 2) {
                    (false, _) => vec!["SET setfusion.strategy = 'cpu'"],
                    (true, 0) => vec!["SET setfusion.min_rows = 0"],
                    (true, _) => vec!["SET setfusion.min_rows = 0", "SET setfusion.memory_limit = '4M'"],
                };
                let ctx = session(settings);
                let want = want.clone();
                tokio::spawn(async move {
                    let ctx = ctx.await;
                    for round in 0..2 {
                        assert_eq!(answers(&ctx).await, want, "session {s}, round {round}");
                    }
                })
            })
            .collect();
        let all = futures::future::join_all(tasks);
        let results = tokio::time::timeout(Duration::from_secs(600), all)
            .await
            .expect("eight sessions did not finish in 10 minutes");
        for r in results {
            r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        if let Some(before) = used_before {
            let after = setfusion::gpu::gpu(0).unwrap().budget().used();
            assert_eq!(after, before, "device budget in use before and after the eight sessions");
        }
        println!(
            "concurrency: 8 sessions x 2 rounds x {} queries agree ({})",
            QUERIES.len(),
            if gpu { "gpu, half at a 4 MiB budget" } else { "cpu backend" }
        );
    });
}
