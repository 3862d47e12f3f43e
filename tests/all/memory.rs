//! Memory accounting (issue 16 item 5): every setfusion operator reserves
//! what it holds in DataFusion's memory pool. Under a generous
//! `memory_limit` each query answers as without one and the pool returns
//! to 0; under a tiny one it fails with `ResourcesExhausted`, naming the
//! operator's consumer, and never panics.

use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::common::block_on;

/// Queries, each with the setfusion operator that must run it.
const QUERIES: &[(&str, &str)] = &[
    ("SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)", "SetOpExec"),
    ("SELECT count(*), sum(v) FROM (SELECT k, v FROM a EXCEPT SELECT k, v FROM b)", "SetOpExec"),
    ("SELECT k, v FROM a EXCEPT ALL SELECT k, v FROM b ORDER BY k, v LIMIT 5", "SetOpExec"),
    ("SELECT count(*), sum(v) FROM a WHERE k NOT IN (SELECT k FROM b)", "SemiJoinExec"),
    ("SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b)", "SemiJoinExec"),
    ("SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b) OR v < 10", "MarkJoinExec"),
    ("SELECT count(*) FROM t x JOIN t y ON x.id < y.id AND jaccard(x.s, y.s) >= 0.5", "SimilarityJoinExec"),
    ("SELECT count(*), sum(cardinality(elements)) FROM intersect_families('f', 'g', 'pairs')", "FamiliesExec"),
];

/// A session with `limit` and `partitions` whose tables are those of `tables`
/// (made there, outside the limit), or made here.
async fn session(limit: Option<usize>, partitions: usize, tables: Option<&SessionContext>) -> SessionContext {
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = limit {
        runtime = runtime.with_memory_limit(limit, 1.0);
    }
    let state = setfusion::install(
        SessionStateBuilder::new()
            .with_default_features()
            .with_config(SessionConfig::new().with_target_partitions(partitions))
            .with_runtime_env(Arc::new(runtime.build().unwrap())),
    )
    .build();
    let ctx = SessionContext::new_with_state(state);
    ctx.sql("SET setfusion.strategy = 'cpu'").await.unwrap().collect().await.unwrap();
    if let Some(from) = tables {
        for t in ["a", "b", "t", "f", "g"] {
            ctx.register_table(t, from.table_provider(t).await.unwrap()).unwrap();
        }
        return ctx;
    }
    for s in [
        "CREATE TABLE a AS SELECT v % 7000 AS k, v FROM generate_series(0, 199999) AS g(v)",
        "CREATE TABLE b AS SELECT v * 3 % 9000 AS k, v FROM generate_series(0, 49999) AS g(v)",
        "CREATE TABLE t AS SELECT v AS id, [v % 5, v % 7, v % 11, 100] AS s FROM generate_series(0, 1999) AS g(v)",
        "CREATE TABLE f AS SELECT v AS id, [v % 13, v % 17, 1000 + v % 3] AS elements FROM generate_series(0, 299) AS g(v)",
        "CREATE TABLE g AS SELECT v AS id, [v % 11, v % 19, 1000 + v % 5] AS elements FROM generate_series(0, 199) AS g(v)",
    ] {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    ctx
}

async fn answer(ctx: &SessionContext, q: &str) -> Result<String, DataFusionError> {
    let batches = ctx.sql(q).await?.collect().await?;
    Ok(datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
}

#[test]
fn operators_reserve_and_release_their_memory() {
    block_on(|| async {
        let free = session(None, 4, None).await;
        let limited = session(Some(1 << 30), 4, Some(&free)).await;
        for (q, operator) in QUERIES {
            let plan = answer(&limited, &format!("EXPLAIN {q}")).await.unwrap();
            assert!(plan.contains(operator), "{q}: {operator} expected in\n{plan}");
            let want = answer(&free, q).await.unwrap();
            let got = answer(&limited, q).await.unwrap_or_else(|e| panic!("{q}: {e}"));
            assert_eq!(got, want, "{q}");
            assert_eq!(limited.runtime_env().memory_pool.reserved(), 0, "{q}: memory left reserved");
        }
    });
}

#[test]
fn a_tiny_limit_fails_with_resources_exhausted() {
    block_on(|| async {
        let consumers = ["SetOpExec", "SemiJoinExec", "MarkJoinExec", "SimilarityJoinExec", "FamiliesExec"];
        // Tables are made before the limit holds; one partition keeps DataFusion's own
        // operators (repartitions) out of the way, so the setfusion operator asks first.
        let free = session(None, 1, None).await;
        for (q, operator) in QUERIES {
            let ctx = session(Some(16 << 10), 1, Some(&free)).await;
            let e = answer(&ctx, q).await.expect_err(q);
            assert!(matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)), "{q}: {e:?}");
            assert!(consumers.iter().any(|c| e.to_string().contains(c)), "{q} ({operator}): {e}");
            assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0, "{q}: memory left reserved");
        }
    });
}

/// The device's pinned staging counts against the pool while an operator
/// holds the device: a limit that holds the inputs but not the staging sends
/// the work to the CPU backend, with the pool's reason in EXPLAIN ANALYZE; a
/// limit that holds both runs on the GPU. Both answer as without a limit and
/// leave nothing reserved.
#[test]
fn device_staging_counts_against_the_pool() {
    // It runs on the device, so it holds the device beside the other tests
    // (the concurrency test reads the device budget before and after).
    let _device = crate::common::shared_device();
    if setfusion::gpu::test_gpu().is_none() {
        return;
    }
    block_on(|| async {
        let free = session(None, 4, None).await;
        let q = "SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b)";
        let want = answer(&free, q).await.unwrap();
        let staging = setfusion::gpu::STAGING_HOST_BYTES;
        for (limit, ran) in
            [(staging / 4, "ran=cpu (GPU failed: Resources exhausted"), (staging + (64 << 20), "ran=gpu")]
        {
            let ctx = session(Some(limit), 4, Some(&free)).await;
            for s in ["SET setfusion.strategy = 'hash'", "SET setfusion.min_rows = 0"] {
                ctx.sql(s).await.unwrap().collect().await.unwrap();
            }
            assert_eq!(answer(&ctx, q).await.unwrap(), want, "limit {limit}");
            let analyzed = answer(&ctx, &format!("EXPLAIN ANALYZE {q}")).await.unwrap();
            assert!(analyzed.contains(ran), "limit {limit}: {ran} expected in\n{analyzed}");
            assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0, "limit {limit}: memory left reserved");
        }
    });
}

/// `MarkJoinExec` forms its output one probe batch at a time as its stream is
/// read: when the first batch comes out, the rest are still reserved (not yet
/// formed), and the reservation shrinks to 0 as they are returned.
#[test]
fn mark_join_output_streams_batch_by_batch() {
    use futures::StreamExt;
    block_on(|| async {
        let free = session(None, 1, None).await;
        let ctx = session(Some(1 << 30), 1, Some(&free)).await;
        let q = "SELECT k, v FROM a WHERE k IN (SELECT k FROM b) OR v < 10";
        let plan = answer(&ctx, &format!("EXPLAIN {q}")).await.unwrap();
        assert!(plan.contains("MarkJoinExec"), "{plan}");
        let mut stream = ctx.sql(q).await.unwrap().execute_stream().await.unwrap();
        let pool = ctx.runtime_env().memory_pool.clone();
        let (mut held, mut batches, mut rows) = (Vec::new(), 0, 0);
        while let Some(b) = stream.next().await {
            rows += b.unwrap().num_rows();
            batches += 1;
            held.push(pool.reserved());
        }
        let want = answer(&free, &format!("SELECT count(*) FROM ({q})")).await.unwrap();
        assert!(want.contains(&format!("| {rows} ")), "{rows} rows against\n{want}");
        assert!(batches > 2, "{batches} batch(es)");
        assert!(held[0] > 0, "nothing reserved after the first batch: the output was formed at once");
        assert!(held.windows(2).all(|w| w[1] <= w[0]), "the reservation grew while streaming: {held:?}");
        drop(stream);
        assert_eq!(pool.reserved(), 0);
    });
}
