//! Codec round trips (encode, bytes, decode: the same plan text and the same
//! answers) for every setfusion operator and logical node, and the
//! hash-partitioned inputs' exactness in one process.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::bytes::{
    logical_plan_from_bytes_with_extension_codec, logical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::AsExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;

use super::demo;
use setfusion::exec::declined::SetfusionDeclinedExec;

/// A fresh directory with the demo tables (`rows` rows each).
async fn tables(test: &str, rows: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("setfusion-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    demo::write_tables(&dir, rows).await.unwrap();
    dir
}

/// A setfusion context over the demo tables with `settings` (`SET` statements).
async fn context(dir: &PathBuf, settings: &[&str]) -> SessionContext {
    let ctx = setfusion::context_with_config(SessionConfig::new().with_target_partitions(4));
    for s in settings {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    demo::register_tables(&ctx, dir).await.unwrap();
    ctx
}

fn plan_text(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

async fn sorted(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Vec<String> {
    let batches = collect(plan, ctx.task_ctx()).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().filter(|l| l.starts_with('|')).skip(1).map(str::to_string).collect();
    lines.sort();
    lines
}

/// Through the physical codec and back as bytes.
fn physical_round_trip(plan: Arc<dyn ExecutionPlan>, ctx: &SessionContext) -> Result<Arc<dyn ExecutionPlan>> {
    let codec = super::physical_codec();
    let bytes = PhysicalPlanNode::try_from_physical_plan(plan, codec.as_ref())?.encode_to_vec();
    PhysicalPlanNode::decode(bytes.as_slice())
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
        .try_into_physical_plan(&ctx.task_ctx(), codec.as_ref())
}

/// `sql`'s plan holds `operator`; its round trip has the same text and answer.
async fn check_physical(ctx: &SessionContext, sql: &str, operator: &str) {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let text = plan_text(&plan);
    assert!(text.contains(operator), "{sql}: no {operator} in\n{text}");
    let back = physical_round_trip(plan.clone(), ctx).unwrap();
    // The dynamic filter a node publishes does not travel (the decoded scan keeps its
    // filter expression, which stays `true`: nothing is pruned, answers are unchanged).
    let unfiltered = text.replace(", dynamic_filter=probe", "").replace(", dynamic_filter=build", "");
    assert_eq!(plan_text(&back), unfiltered, "{sql}");
    assert_eq!(sorted(back, ctx).await, sorted(plan, ctx).await, "{sql}");
}

#[tokio::test]
async fn every_operator_round_trips_through_the_physical_codec() {
    let dir = tables("physical-codec", 3000).await;
    let default = context(&dir, &[]).await;
    let cpu = context(&dir, &["SET setfusion.strategy = 'cpu'"]).await;
    let partitioned =
        context(&dir, &["SET setfusion.strategy = 'cpu'", "SET setfusion.hash_partition_inputs = true"]).await;
    for ctx in [&default, &cpu, &partitioned] {
        check_physical(ctx, "SELECT k FROM r INTERSECT ALL SELECT k FROM t", "SetOpExec: op=intersect all").await;
        check_physical(ctx, "SELECT k, v FROM r EXCEPT ALL SELECT k, v FROM t", "SetOpExec: op=except all").await;
        check_physical(ctx, "SELECT a.id, b.id FROM docs_a a JOIN docs_b b ON jaccard(a.elements, b.elements) >= 0.8 AND a.id < b.id + 5", "SimilarityJoinExec").await;
        check_physical(ctx, "SELECT * FROM intersect_families('docs_a', 'docs_b', 'pairs')", "FamiliesExec").await;
        check_physical(ctx, "SELECT * FROM intersect_families('docs_a')", "FamiliesExec").await;
        check_physical(ctx, "SELECT k, k IN (SELECT k FROM t) OR v > 990 AS m FROM r", "MarkJoinExec: kind=in").await;
    }
    for ctx in [&cpu, &partitioned] {
        check_physical(ctx, "SELECT k, v FROM r WHERE k IN (SELECT k FROM t)", "SemiJoinExec: op=semi").await;
        check_physical(ctx, "SELECT k, v FROM r WHERE k NOT IN (SELECT k FROM t WHERE k < 500)", "null_aware").await;
        check_physical(
            ctx,
            "SELECT k FROM r WHERE EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.v > r.v)",
            "MarkJoinExec: kind=semi",
        )
        .await;
    }
    check_physical(&partitioned, "SELECT k FROM r INTERSECT ALL SELECT k FROM t", "partitioned").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn declined_note_round_trips() {
    let dir = tables("declined-codec", 300).await;
    let ctx = context(&dir, &[]).await;
    let scan = ctx.sql("SELECT k FROM r").await.unwrap().create_physical_plan().await.unwrap();
    let plan: Arc<dyn ExecutionPlan> = Arc::new(SetfusionDeclinedExec::new(
        scan,
        setfusion::exec::common::Reason::BelowMinRows {
            count: 12,
            unit: setfusion::exec::common::Unit::Rows,
            min_rows: 100,
        },
    ));
    let back = physical_round_trip(plan.clone(), &ctx).unwrap();
    assert_eq!(plan_text(&back), plan_text(&plan));
    assert_eq!(sorted(back, &ctx).await, sorted(plan, &ctx).await);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Parquet scan whose float conjunct setfusion hid from the pruning
/// (`setfusion_unpruned`) travels as it is, and answers the same.
#[tokio::test]
async fn unpruned_float_filters_round_trip() {
    let dir = tables("unpruned-codec", 300).await;
    let ctx = context(&dir, &[]).await;
    let file = dir.join("floats/0.parquet");
    let copy = format!(
        "COPY (SELECT CAST(v AS DOUBLE) / 4 AS f, v AS k FROM generate_series(1, 100) g(v)) TO '{}' STORED AS PARQUET",
        file.display()
    );
    ctx.sql(&copy).await.unwrap().collect().await.unwrap();
    ctx.register_parquet("floats", &format!("{}/floats/", dir.display()), Default::default()).await.unwrap();
    check_physical(&ctx, "SELECT k FROM floats WHERE f > 20 AND k > 3", "setfusion_unpruned(f@0 > 20)").await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Damaged bytes are an error, never a panic.
#[tokio::test]
async fn damaged_bytes_are_errors() {
    let dir = tables("damaged-codec", 300).await;
    let ctx = context(&dir, &["SET setfusion.strategy = 'cpu'"]).await;
    let codec = super::physical_codec();
    let plan =
        ctx.sql("SELECT k FROM r INTERSECT ALL SELECT k FROM t").await.unwrap().create_physical_plan().await.unwrap();
    let set_op = find(&plan, "SetOpExec").expect("a SetOpExec");
    let mut buf = Vec::new();
    codec
        .try_encode(set_op.clone(), &mut buf, &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {})
        .unwrap();
    let inputs: Vec<Arc<dyn ExecutionPlan>> = set_op.children().into_iter().cloned().collect();
    let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
    for cut in [buf.len() - 1, buf.len() / 2, 20] {
        assert!(codec.try_decode(&buf[..cut], &inputs, &ctx.task_ctx(), &converter).is_err(), "cut at {cut}");
    }
    let e = codec.try_decode(&buf, &inputs[..1], &ctx.task_ctx(), &converter).unwrap_err();
    assert!(e.to_string().contains("needs two inputs"), "{e}");
    assert!(codec.try_decode(&buf, &inputs, &ctx.task_ctx(), &converter).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

fn find(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.name() == name {
        return Some(plan.clone());
    }
    plan.children().into_iter().find_map(|c| find(c, name))
}

/// The logical nodes and the table function's tables go through the logical
/// codec: the same plan text, and the decoded plan gives the same answer.
#[tokio::test]
async fn logical_nodes_round_trip_through_the_logical_codec() {
    let dir = tables("logical-codec", 2000).await;
    let ctx = context(&dir, &[]).await;
    let codec = super::logical_codec();
    for (sql, node) in [
        ("SELECT k FROM r INTERSECT ALL SELECT k FROM t", "SetOp: INTERSECT ALL"),
        ("SELECT k, v FROM r EXCEPT ALL SELECT k, v FROM t", "SetOp: EXCEPT ALL"),
        ("SELECT k, k IN (SELECT k FROM t) OR v > 990 AS m FROM r", "MarkJoin: IN"),
        ("SELECT * FROM intersect_families('docs_a', 'docs_b', 'pairs')", "intersect_families"),
        ("SELECT a.id FROM docs_a a JOIN docs_b b ON jaccard(a.elements, b.elements) >= 0.8", "jaccard"),
    ] {
        let plan = ctx.sql(sql).await.unwrap().into_optimized_plan().unwrap();
        let text = plan.display_indent().to_string();
        assert!(text.contains(node), "{sql}: no {node} in\n{text}");
        let bytes = logical_plan_to_bytes_with_extension_codec(&plan, codec.as_ref()).unwrap();
        let back = logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), codec.as_ref()).unwrap();
        assert_eq!(back.display_indent().to_string(), text, "{sql}");
        let state = ctx.state();
        let (a, b) =
            (state.create_physical_plan(&plan).await.unwrap(), state.create_physical_plan(&back).await.unwrap());
        assert_eq!(sorted(b, &ctx).await, sorted(a, &ctx).await, "{sql}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hash-partitioned inputs (each partition decided on its own) give the
/// answers of one selection over everything, with a hash repartition of
/// both inputs below every set operation and semi / anti join.
#[tokio::test]
async fn hash_partitioned_inputs_stay_exact() {
    let dir = tables("partitioned", 5000).await;
    let whole = context(&dir, &["SET setfusion.strategy = 'cpu'"]).await;
    let partitioned =
        context(&dir, &["SET setfusion.strategy = 'cpu'", "SET setfusion.hash_partition_inputs = true"]).await;
    for (name, sql) in demo::QUERIES {
        let plan = partitioned.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let text = plan_text(&plan);
        // NOT IN reads everything in every partition; the mark joins (IN under OR, EXISTS
        // with a filter) broadcast their subquery side to each probe partition; the
        // similarity join has one partition.
        let mark_join = ["in under or", "exists with a filter", "not exists with a filter"].contains(name);
        let decided_per_partition = !mark_join && !["not in", "similarity join"].contains(name);
        if decided_per_partition {
            assert!(text.contains(", partitioned"), "{name}: not partitioned:\n{text}");
            assert!(text.contains("RepartitionExec: partitioning=Hash"), "{name}: no hash repartition:\n{text}");
        }
        if mark_join && text.contains("MarkJoinExec") {
            assert!(text.contains("subquery=broadcast"), "{name}: subquery side not broadcast:\n{text}");
            let mark = find(&plan, "MarkJoinExec").expect("a MarkJoinExec");
            assert_eq!(mark.children()[1].output_partitioning().partition_count(), 1, "{name}:\n{text}");
            assert!(mark.output_partitioning().partition_count() > 1, "{name}: probe side in one partition:\n{text}");
        }
        let want = demo::sorted_rows(&whole, sql).await.unwrap();
        assert!(!want.is_empty(), "{name}: empty answer");
        assert_eq!(demo::sorted_rows(&partitioned, sql).await.unwrap(), want, "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
