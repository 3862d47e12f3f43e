//! What every setfusion operator keeps of DataFusion's contract for an
//! `ExecutionPlan` (issue 29), checked on a node of a real query's plan by the
//! operators' own tests: its properties, its partitions, cancellation and the
//! memory it reserves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::execution::memory_pool::{TrackConsumersPool, UnboundedMemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::{collect, collect_partitioned, displayable, ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;

/// The first node named `name` in `plan`.
pub(crate) fn find(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Arc<dyn ExecutionPlan> {
    let mut nodes = vec![plan.clone()];
    while let Some(node) = nodes.pop() {
        if node.name() == name {
            return node;
        }
        nodes.extend(node.children().into_iter().cloned());
    }
    panic!("no {name} in\n{}", displayable(plan.as_ref()).indent(true))
}

/// Each row of `batches` as text, sorted (a multiset to compare).
pub(crate) fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let columns: Vec<ArrayFormatter<'_>> =
            b.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap()).collect();
        rows.extend(
            (0..b.num_rows()).map(|r| columns.iter().map(|c| c.value(r).to_string()).collect::<Vec<_>>().join("|")),
        );
    }
    rows.sort();
    rows
}

/// The session's memory pool, which knows each reservation's name.
pub(crate) type Pool = Arc<TrackConsumersPool<UnboundedMemoryPool>>;

/// A setfusion session of `partitions` partitions whose memory pool tracks
/// its consumers, `settings` run on it (SET statements, CREATE TABLEs).
pub(crate) async fn session(partitions: usize, settings: &[&str]) -> (SessionContext, Pool) {
    let pool: Pool = Arc::new(TrackConsumersPool::new(UnboundedMemoryPool::default(), 5.try_into().unwrap()));
    let runtime = RuntimeEnvBuilder::new().with_memory_pool(pool.clone()).build_arc().unwrap();
    let config = SessionConfig::new().with_target_partitions(partitions);
    let builder = SessionStateBuilder::new().with_config(config).with_runtime_env(runtime).with_default_features();
    let ctx = SessionContext::new_with_state(crate::install(builder).build());
    for s in settings {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    (ctx, pool)
}

/// The bytes the operator's reservations (named `name`, as the operators
/// name theirs) hold, once every reservation that is going away has gone (a
/// cancelled task releases its own as it ends), or what they still hold after
/// a few seconds. (DataFusion's own nodes below may keep theirs until the plan
/// is dropped: a CollectLeft hash join keeps its build side.)
async fn settled_reservations(pool: &Pool, name: &str) -> usize {
    let held = || pool.metrics().iter().filter(|m| m.name == name).map(|m| m.reserved).sum::<usize>();
    let t = Instant::now();
    while held() > 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held()
}

/// Check the node named `name` in `sql`'s plan on `ctx`; returns its rows
/// (sorted, as text).
///
/// - **Properties**: its partition count, ordering, emission type and
///   boundedness are those of the node rebuilt over the same children
///   (computed from the node's fields, not from an execution), and its
///   properties' schema is its schema.
/// - **Partitions**: it answers on exactly that many partitions, each
///   batch of its schema, and the partitions together give the rows of the
///   whole node collected at once.
/// - **Memory**: once an execution ends, the operator's reservations hold
///   nothing.
/// - **Cancellation**: every partition started, one batch taken, then all
///   dropped, the reservations are released, and the next execution
///   answers the same rows.
///
/// (Each execution plans the query again: DataFusion's RepartitionExec
/// executes once per plan.)
pub(crate) async fn check(ctx: &SessionContext, pool: &Pool, sql: &str, name: &str) -> Vec<String> {
    // A fresh plan for each execution: DataFusion's RepartitionExec runs once per plan.
    let planned = || async {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        find(&plan, name)
    };
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let node = find(&plan, name);
    let text = displayable(plan.as_ref()).indent(true).to_string();
    let partitions = node.output_partitioning().partition_count();

    // Properties.
    let recompute = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    let rebuilt = node.clone().replace_children(node.children().into_iter().cloned().collect(), recompute).unwrap();
    // (Partitioning's `==` holds no UnknownPartitioning equal to another: its text, then.)
    let partitioning = |p: &Arc<dyn ExecutionPlan>| format!("{:?}", p.output_partitioning());
    assert_eq!(partitioning(&rebuilt), partitioning(&node), "{name}: partitioning\n{text}");
    assert_eq!(rebuilt.output_ordering(), node.output_ordering(), "{name}: ordering\n{text}");
    assert_eq!(rebuilt.pipeline_behavior(), node.pipeline_behavior(), "{name}: emission\n{text}");
    assert_eq!(rebuilt.boundedness(), node.boundedness(), "{name}: boundedness\n{text}");
    assert_eq!(node.properties().eq_properties.schema(), &node.schema(), "{name}: schema\n{text}");

    // Partitions, and memory after each execution.
    let task: Arc<TaskContext> = ctx.task_ctx();
    let whole = collect(node.clone(), task.clone()).await.unwrap();
    assert_eq!(settled_reservations(pool, name).await, 0, "{name}: memory still reserved after collect\n{text}");
    let parts = collect_partitioned(planned().await, task.clone()).await.unwrap();
    assert_eq!(parts.len(), partitions, "{name}: partitions\n{text}");
    for b in parts.iter().flatten() {
        assert_eq!(b.schema(), node.schema(), "{name}: a batch's schema\n{text}");
    }
    let rows = sorted_rows(&whole);
    assert_eq!(sorted_rows(&parts.concat()), rows, "{name}: partitions vs whole\n{text}");
    assert_eq!(settled_reservations(pool, name).await, 0, "{name}: memory still reserved after the partitions\n{text}");

    // Cancellation.
    let cancelled = planned().await;
    let mut streams: Vec<_> = (0..partitions).map(|p| cancelled.execute(p, task.clone()).unwrap()).collect();
    if let Some(first) = streams.first_mut() {
        let _ = first.next().await;
    }
    drop(streams);
    drop(cancelled);
    assert_eq!(settled_reservations(pool, name).await, 0, "{name}: memory still reserved after cancellation\n{text}");
    let again = collect(planned().await, task).await.unwrap();
    assert_eq!(sorted_rows(&again), rows, "{name}: the execution after a cancelled one\n{text}");
    assert_eq!(settled_reservations(pool, name).await, 0, "{name}: memory still reserved\n{text}");
    rows
}

/// The strategies (`setfusion.strategy`) the operators' contract tests run
/// under: the CPU backend, and the device's hash tables where a device is
/// present (else a printed reason).
pub(crate) fn strategies() -> Vec<&'static str> {
    let mut s = vec!["cpu"];
    if crate::gpu::test_gpu().is_some() {
        s.push("hash");
    }
    s
}
