//! Every setfusion operator checked through SQL, in sessions with setfusion
//! installed (issue 29): DataFusion's baseline metrics, each registered once,
//! and what the operator keeps of DataFusion's contract for an
//! `ExecutionPlan` (its properties, its partitions, cancellation and the
//! memory it reserves). The planner builds the nodes, so these tests sit
//! above it, at the crate's top, not beside the operators in `exec`.

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
fn find(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Arc<dyn ExecutionPlan> {
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
fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
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
type Pool = Arc<TrackConsumersPool<UnboundedMemoryPool>>;

/// A setfusion session of `partitions` partitions whose memory pool tracks
/// its consumers, `settings` run on it (SET statements, CREATE TABLEs).
async fn session(partitions: usize, settings: &[&str]) -> (SessionContext, Pool) {
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
async fn contract(ctx: &SessionContext, pool: &Pool, sql: &str, name: &str) -> Vec<String> {
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
fn strategies() -> Vec<&'static str> {
    let mut s = vec!["cpu"];
    if crate::gpu::test_gpu().is_some() {
        s.push("hash");
    }
    s
}

/// A session of `partitions` partitions on the CPU backend, every operator
/// setfusion's (`setfusion.min_rows = 0`), with `tables` made on it.
async fn cpu_session(partitions: usize, tables: &[&str]) -> SessionContext {
    let settings: Vec<&str> = ["SET setfusion.strategy = 'cpu'", "SET setfusion.min_rows = 0"]
        .into_iter()
        .chain(tables.iter().copied())
        .collect();
    session(partitions, &settings).await.0
}

/// [`contract`] of the node each of `queries` (SQL, node name) plans, under
/// every strategy of [`strategies`], in a session of 3 partitions with
/// `tables` made on it (after `SET setfusion.strategy` and
/// `setfusion.min_rows = 0`); every query answers some rows.
async fn contract_under_every_strategy(tables: &[&str], queries: &[(&str, &str)]) {
    for strategy in strategies() {
        let mut settings = vec![format!("SET setfusion.strategy = '{strategy}'"), "SET setfusion.min_rows = 0".into()];
        settings.extend(tables.iter().map(|t| t.to_string()));
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let (ctx, pool) = session(3, &settings).await;
        for (sql, name) in queries {
            let rows = contract(&ctx, &pool, sql, name).await;
            assert!(!rows.is_empty(), "{strategy}: {sql}");
        }
    }
}

/// Run `sql`: the executed plan and the rows it returned.
async fn run(ctx: &SessionContext, sql: &str) -> (Arc<dyn ExecutionPlan>, usize) {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let batches = collect(plan.clone(), ctx.task_ctx()).await.unwrap();
    (plan, batches.iter().map(|b| b.num_rows()).sum())
}

/// The set selection: `SetOpExec` and `SemiJoinExec`.
mod set_select {
    use super::{contract_under_every_strategy, cpu_session, run};
    use crate::exec::metrics_check::check;

    /// DataFusion's baseline metrics per output partition, including the row
    /// count path (count(*)), and the execution's metrics once, though three
    /// partitions share it.
    #[tokio::test]
    async fn metrics_are_registered_once() {
        let ctx = cpu_session(
            3,
            &[
                "CREATE TABLE a AS SELECT v % 70 AS k, v FROM generate_series(0, 1999) AS g(v)",
                "CREATE TABLE b AS SELECT v * 3 % 90 AS k, v FROM generate_series(0, 499) AS g(v)",
            ],
        )
        .await;
        for (sql, name) in [
            ("SELECT k FROM a INTERSECT ALL SELECT k FROM b", "SetOpExec"),
            ("SELECT k, v FROM a EXCEPT SELECT k, v FROM b", "SetOpExec"),
            ("SELECT k, v FROM a WHERE k IN (SELECT k FROM b)", "SemiJoinExec"),
        ] {
            let (plan, rows) = run(&ctx, sql).await;
            assert!(rows > 0, "{sql}");
            check(&plan, name, rows, true);
        }
        let sql = "SELECT count(*) FROM a WHERE k NOT IN (SELECT k FROM b)";
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let batches = datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await.unwrap();
        let count =
            batches[0].column(0).as_any().downcast_ref::<datafusion::arrow::array::Int64Array>().unwrap().value(0);
        assert!(count > 0);
        check(&plan, "SemiJoinExec", count as usize, true);
    }

    /// DataFusion's operator contract ([`super::contract`])
    /// of the selection node, as set operation and as semi / anti join, with
    /// NULL keys.
    #[tokio::test]
    async fn keeps_the_operator_contract() {
        contract_under_every_strategy(
            &[
                "CREATE TABLE a AS SELECT CASE WHEN v % 97 = 0 THEN NULL ELSE v % 70 END AS k, v \
                     FROM generate_series(0, 1999) AS g(v)",
                "CREATE TABLE b AS SELECT CASE WHEN v % 89 = 0 THEN NULL ELSE v * 3 % 90 END AS k, v \
                     FROM generate_series(0, 499) AS g(v)",
            ],
            &[
                ("SELECT k FROM a INTERSECT ALL SELECT k FROM b", "SetOpExec"),
                ("SELECT k, v FROM a EXCEPT ALL SELECT k, v FROM b", "SetOpExec"),
                ("SELECT k, v FROM a WHERE k IN (SELECT k FROM b)", "SemiJoinExec"),
                ("SELECT k, v FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)", "SemiJoinExec"),
            ],
        )
        .await;
    }
}

/// `MarkJoinExec`.
mod mark_join {
    use super::{contract_under_every_strategy, cpu_session, run};
    use crate::exec::metrics_check::check;

    /// DataFusion's baseline metrics per partition, and the execution's
    /// metrics once, though a correlated IN runs three selections (group,
    /// key, NULL key).
    #[tokio::test]
    async fn metrics_are_registered_once() {
        let ctx = cpu_session(
            3,
            &[
                "CREATE TABLE a AS SELECT v % 70 AS k, v FROM generate_series(0, 1999) AS g(v)",
                "CREATE TABLE b AS SELECT CASE WHEN v % 50 = 0 THEN NULL ELSE v * 3 % 90 END AS k, v % 300 AS v \
                 FROM generate_series(0, 499) AS g(v)",
            ],
        )
        .await;
        for sql in [
            "SELECT k, v FROM a WHERE k IN (SELECT k FROM b) OR v < 10",
            "SELECT k, v FROM a WHERE k IN (SELECT b.k FROM b WHERE b.v = a.v) OR v < 10",
        ] {
            let (plan, _) = run(&ctx, sql).await;
            // A mark for every row of `a`; the filter above keeps some.
            check(&plan, "MarkJoinExec", 2000, true);
        }
    }

    /// DataFusion's operator contract ([`super::contract`]):
    /// properties, partitions, memory, cancellation; uncorrelated and
    /// correlated marks, three-valued (NULL keys on both sides).
    #[tokio::test]
    async fn keeps_the_operator_contract() {
        contract_under_every_strategy(
            &[
                "CREATE TABLE a AS SELECT CASE WHEN v % 97 = 0 THEN NULL ELSE v % 70 END AS k, v \
                     FROM generate_series(0, 1999) AS g(v)",
                "CREATE TABLE b AS SELECT CASE WHEN v % 50 = 0 THEN NULL ELSE v * 3 % 90 END AS k, v % 300 AS v \
                     FROM generate_series(0, 499) AS g(v)",
            ],
            &[
                ("SELECT k, v, k IN (SELECT k FROM b) AS m FROM a", "MarkJoinExec"),
                ("SELECT k, v FROM a WHERE k NOT IN (SELECT k FROM b) OR v < 10", "MarkJoinExec"),
                ("SELECT k, v FROM a WHERE k IN (SELECT b.k FROM b WHERE b.v = a.v) OR v < 10", "MarkJoinExec"),
            ],
        )
        .await;
    }

    /// The same contract with the subquery side broadcast (as on a Ballista
    /// cluster): the probe side keeps its partitions, each marked against the
    /// whole subquery, collected once; its reservation is released with the
    /// last partition's run, or on cancellation.
    #[tokio::test]
    async fn keeps_the_operator_contract_with_the_subquery_broadcast() {
        use datafusion::physical_plan::ExecutionPlanProperties;
        let tables = [
            "SET setfusion.hash_partition_inputs = true",
            "CREATE TABLE a AS SELECT CASE WHEN v % 97 = 0 THEN NULL ELSE v % 70 END AS k, v \
                 FROM generate_series(0, 1999) AS g(v)",
            "CREATE TABLE b AS SELECT CASE WHEN v % 50 = 0 THEN NULL ELSE v * 3 % 90 END AS k, v % 300 AS v \
                 FROM generate_series(0, 499) AS g(v)",
        ];
        let queries = [
            ("SELECT k, v, k IN (SELECT k FROM b) AS m FROM a", "MarkJoinExec"),
            ("SELECT k, v FROM a WHERE k NOT IN (SELECT k FROM b) OR v < 10", "MarkJoinExec"),
            ("SELECT k, v FROM a WHERE k IN (SELECT b.k FROM b WHERE b.v = a.v) OR v < 10", "MarkJoinExec"),
            ("SELECT k, v FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k AND b.v > a.v)", "MarkJoinExec"),
        ];
        let ctx = cpu_session(3, &tables).await;
        let plain = cpu_session(3, &tables[1..]).await;
        for (sql, _) in queries {
            let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
            let mark = super::find(&plan, "MarkJoinExec");
            assert!(text.contains("subquery=broadcast"), "{sql}:\n{text}");
            assert!(mark.output_partitioning().partition_count() > 1, "{sql}: the probe side in one partition\n{text}");
            assert_eq!(mark.children()[1].output_partitioning().partition_count(), 1, "{sql}:\n{text}");
            // The marks of one selection over everything.
            let rows = |ctx: &datafusion::prelude::SessionContext| {
                let ctx = ctx.clone();
                async move { super::sorted_rows(&ctx.sql(sql).await.unwrap().collect().await.unwrap()) }
            };
            assert_eq!(rows(&ctx).await, rows(&plain).await, "{sql}");
        }
        contract_under_every_strategy(&tables, &queries).await;
    }
}

/// `SimilarityJoinExec`.
mod similarity_join {
    use super::{contract_under_every_strategy, cpu_session, find, run, sorted_rows};
    use crate::exec::metrics_check::check;

    #[tokio::test]
    async fn metrics_are_datafusions() {
        let ctx = cpu_session(
            2,
            &[
                "CREATE TABLE t AS SELECT v AS id, [v % 5, v % 7, v % 11, 100] AS s FROM generate_series(0, 299) AS g(v)",
            ],
        )
        .await;
        let (plan, rows) =
            run(&ctx, "SELECT x.id, y.id FROM t x JOIN t y ON x.id < y.id AND jaccard(x.s, y.s) >= 0.5").await;
        assert!(rows > 0);
        check(&plan, "SimilarityJoinExec", rows, true);
    }

    /// DataFusion's operator contract ([`super::contract`]),
    /// a self join and a join of two tables, NULL lists and elements among them.
    #[tokio::test]
    async fn keeps_the_operator_contract() {
        contract_under_every_strategy(
            &[
                "CREATE TABLE t AS SELECT v AS id, CASE WHEN v % 41 = 0 THEN NULL \
                     ELSE [v % 5, v % 7, v % 11, 100, CASE WHEN v % 3 = 0 THEN NULL ELSE 7 END] END AS s \
                     FROM generate_series(0, 299) AS g(v)",
                "CREATE TABLE u AS SELECT v AS id, [v % 6, v % 7, 100] AS s FROM generate_series(0, 199) AS g(v)",
            ],
            &[
                (
                    "SELECT x.id, y.id FROM t x JOIN t y ON x.id < y.id AND jaccard(x.s, y.s) >= 0.5",
                    "SimilarityJoinExec",
                ),
                ("SELECT t.id, u.id FROM t JOIN u ON overlap(t.s, u.s) >= 3", "SimilarityJoinExec"),
            ],
        )
        .await;
    }

    /// Two in-memory tables of one shape (schema and row counts) are two
    /// tables, not a self join: the answer is DataFusion's own (setfusion off).
    #[tokio::test]
    async fn different_tables_of_one_shape_are_not_a_self_join() {
        let ctx = cpu_session(
            2,
            &[
                "CREATE TABLE t AS SELECT v AS id, [v % 5, v % 7, 100] AS s FROM generate_series(0, 59) AS g(v)",
                "CREATE TABLE u AS SELECT v AS id, [v % 3, v % 4, 200] AS s FROM generate_series(0, 59) AS g(v)",
            ],
        )
        .await;
        let sql = "SELECT t.id, u.id FROM t JOIN u ON jaccard(t.s, u.s) >= 0.5";
        let answer = |ctx: &datafusion::prelude::SessionContext| {
            let ctx = ctx.clone();
            async move { sorted_rows(&ctx.sql(sql).await.unwrap().collect().await.unwrap()) }
        };
        let (plan, _) = run(&ctx, sql).await;
        find(&plan, "SimilarityJoinExec");
        let got = answer(&ctx).await;
        ctx.sql("SET setfusion.enabled = false").await.unwrap().collect().await.unwrap();
        assert_eq!(got, answer(&ctx).await);
    }
}

/// `FamiliesExec`.
mod families {
    use super::{contract_under_every_strategy, run, session};
    use crate::exec::metrics_check::check;

    #[tokio::test]
    async fn metrics_are_datafusions() {
        let (ctx, _pool) = session(
            2,
            &[
                "SET setfusion.strategy = 'cpu'",
                "CREATE TABLE f AS SELECT v AS id, [v % 13, v % 17, 1000 + v % 3] AS elements \
                 FROM generate_series(0, 99) AS g(v)",
                "CREATE TABLE g AS SELECT v AS id, [v % 11, v % 19, 1000 + v % 5] AS elements \
                 FROM generate_series(0, 79) AS g(v)",
            ],
        )
        .await;
        for level in ["pairs", "distinct", "counts"] {
            let (plan, rows) = run(&ctx, &format!("SELECT * FROM intersect_families('f', 'g', '{level}')")).await;
            assert!(rows > 0, "{level}");
            check(&plan, "FamiliesExec", rows, true);
        }
    }

    /// DataFusion's operator contract ([`super::contract`]),
    /// at every level, of two families and of one with itself.
    #[tokio::test]
    async fn keeps_the_operator_contract() {
        contract_under_every_strategy(
            &[
                "CREATE TABLE f AS SELECT v AS id, CASE WHEN v % 31 = 0 THEN NULL \
                     ELSE [v % 13, v % 17, 1000 + v % 3] END AS elements FROM generate_series(0, 99) AS g(v)",
                "CREATE TABLE g AS SELECT v AS id, [v % 11, v % 19, 1000 + v % 5] AS elements \
                     FROM generate_series(0, 79) AS g(v)",
            ],
            &[
                ("SELECT * FROM intersect_families('f', 'g')", "FamiliesExec"),
                ("SELECT * FROM intersect_families('f', 'g', 'pairs')", "FamiliesExec"),
                ("SELECT * FROM intersect_families('f', 'g', 'all')", "FamiliesExec"),
                ("SELECT * FROM intersect_families('f', 'pairs')", "FamiliesExec"),
                ("SELECT * FROM intersect_families('f', 'g', 'counts')", "FamiliesExec"),
                ("SELECT * FROM intersect_families('f', 'counts')", "FamiliesExec"),
            ],
        )
        .await;
    }

    /// The `counts` level is the size of every non-empty pair's intersection
    /// that `pairs` materialises, for two families and the self form, on the
    /// CPU and (where there is one) the GPU.
    #[tokio::test]
    async fn counts_are_the_sizes_of_the_pairs() {
        for setting in ["SET setfusion.strategy = 'cpu'", "SET setfusion.min_rows = 0"] {
            let (ctx, _pool) = session(
                2,
                &[
                    setting,
                    "CREATE TABLE f AS SELECT v % 150 AS id, CASE WHEN v % 37 = 0 THEN NULL \
                     ELSE [v % 13, v % 17, 1000 + v % 3, v * 7 % 101, v % 5] END AS elements \
                     FROM generate_series(0, 299) AS g(v)",
                    "CREATE TABLE g AS SELECT v AS id, [v % 11, v % 19, 1000 + v % 5, v % 3] AS elements \
                     FROM generate_series(0, 199) AS g(v)",
                ],
            )
            .await;
            for args in ["'f', 'g'", "'f'"] {
                let rows = |sql: String| {
                    let ctx = ctx.clone();
                    async move { super::sorted_rows(&ctx.sql(&sql).await.unwrap().collect().await.unwrap()) }
                };
                let counts =
                    rows(format!("SELECT left_id, right_id, overlap FROM intersect_families({args}, 'counts')")).await;
                let pairs = rows(format!(
                    "SELECT left_id, right_id, CAST(cardinality(elements) AS BIGINT) FROM intersect_families({args}, 'pairs')"
                ))
                .await;
                assert!(!counts.is_empty(), "{setting} {args}");
                assert_eq!(counts, pairs, "{setting} {args}");
            }
        }
    }

    /// Few large sets of ids over a wide range (seed 004's SISI shape): the
    /// counts level picks the partitioned search (IP-OBS) on the GPU, says so
    /// in EXPLAIN ANALYZE, and counts as the CPU backend does.
    #[tokio::test]
    async fn few_large_sets_count_by_partitioned_search() {
        let on_gpu = crate::gpu::test_gpu().is_some();
        let make = "CREATE TABLE big AS SELECT id, array_concat(range(0, 2000000, 97), \
                    range(id * 7, 30000000, 911 + id * 13)) AS elements FROM (VALUES (0), (1), (2), (3)) AS t(id)";
        let query = "SELECT left_id, right_id, overlap FROM intersect_families('big', 'counts')";
        let mut answers = Vec::new();
        for setting in ["SET setfusion.strategy = 'cpu'", "SET setfusion.min_rows = 0"] {
            let (ctx, _pool) = session(2, &[setting, make]).await;
            answers.push(super::sorted_rows(&ctx.sql(query).await.unwrap().collect().await.unwrap()));
            let explained = ctx.sql(&format!("EXPLAIN ANALYZE {query}")).await.unwrap().collect().await.unwrap();
            let explained = datafusion::arrow::util::pretty::pretty_format_batches(&explained).unwrap().to_string();
            if on_gpu && setting.contains("min_rows") {
                assert!(explained.contains("gpu by partitioned search (IP-OBS)"), "{explained}");
            }
        }
        assert_eq!(answers[0].len(), 6, "every pair shares the multiples of 97");
        assert_eq!(answers[0], answers[1]);
    }
}

/// `SetfusionDeclinedExec`.
mod declined {
    use super::{run, session};
    use crate::exec::metrics_check::check;

    /// Declined (fewer rows than `setfusion.min_rows`), the node passes its
    /// input's rows on and counts them.
    #[tokio::test]
    async fn metrics_are_datafusions() {
        let (ctx, _pool) = session(
            2,
            &[
                "CREATE TABLE a AS SELECT v % 70 AS k, v FROM generate_series(0, 999) AS g(v)",
                "CREATE TABLE b AS SELECT v * 3 % 90 AS k FROM generate_series(0, 199) AS g(v)",
            ],
        )
        .await;
        let (plan, rows) = run(&ctx, "SELECT k, v FROM a WHERE k IN (SELECT k FROM b)").await;
        assert!(rows > 0);
        check(&plan, "SetfusionDeclinedExec", rows, false);
    }
}

/// DataFusion's hash joins on float keys: their dynamic filter of the build
/// keys' bounds compares in total order (-0.0 below 0.0, which the joins
/// equate), so it stops above the probe side (`planner::float_key_bounds`).
mod float_key_bounds {
    use super::{find, session, sorted_rows};
    use datafusion::physical_plan::{collect, displayable};

    #[tokio::test]
    async fn minus_zero_matches_zero_under_every_dynamic_filter() {
        let (ctx, _) = session(
            2,
            &[
                // The larger sides are the probe sides, sorted below the joins, under their filters
                // (DataFusion alone answered none of the first four with the zeros).
                "CREATE TABLE t AS SELECT * FROM (VALUES (1.0::double), ('NaN'::double), (-0.0), (2.5)) t(a) \
                 UNION ALL SELECT v::double * 10 FROM generate_series(1, 50) g(v)",
                "CREATE TABLE s AS SELECT * FROM (VALUES (0.0::double), ('NaN'::double), (2.5)) s(b)",
                "CREATE TABLE u AS SELECT * FROM (VALUES (0.0::double), (1.0)) u(c) \
                 UNION ALL SELECT v::double * 10 FROM generate_series(1, 50) g(v)",
                "CREATE TABLE w AS SELECT * FROM (VALUES (-0.0::double), (-1.0)) w(d)",
            ],
        )
        .await;
        // Answers from SQL's rules: -0.0 = 0.0; 'NaN' = 'NaN' (DataFusion's equality).
        for (sql, want) in [
            ("SELECT a FROM t JOIN s ON a = b ORDER BY a", vec!["-0.0", "2.5", "NaN"]),
            ("SELECT a FROM t WHERE a IN (SELECT b FROM s) ORDER BY a", vec!["-0.0", "2.5", "NaN"]),
            ("SELECT c FROM u JOIN w ON c = d ORDER BY c", vec!["0.0"]),
            ("SELECT c FROM u WHERE EXISTS (SELECT 1 FROM w WHERE c = d) ORDER BY c", vec!["0.0"]),
            ("SELECT a FROM t JOIN s ON a = b ORDER BY a LIMIT 2", vec!["-0.0", "2.5"]),
        ] {
            let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let batches = collect(plan.clone(), ctx.task_ctx()).await.unwrap();
            let mut want: Vec<String> = want.into_iter().map(String::from).collect();
            want.sort();
            assert_eq!(sorted_rows(&batches), want, "{sql}\n{}", displayable(plan.as_ref()).indent(true));
            if sql.contains("JOIN") {
                let shown = displayable(find(&plan, "HashJoinExec").as_ref()).indent(true).to_string();
                assert!(shown.contains("not pushed below here"), "{sql}\n{shown}");
            }
        }
        // Integer keys keep DataFusion's dynamic filter.
        let plan = ctx
            .sql("SELECT 1 FROM generate_series(1, 5) x(v) JOIN generate_series(2, 3) y(k) ON v = k ORDER BY 1")
            .await
            .unwrap();
        let plan = plan.create_physical_plan().await.unwrap();
        let shown = displayable(plan.as_ref()).indent(true).to_string();
        assert!(!shown.contains("not pushed below here"), "{shown}");
    }
}

mod float_statistics {
    use super::{session, sorted_rows};
    use datafusion::physical_plan::{collect, displayable};

    /// Parquet leaves NaN out of a float column's min / max, and DataFusion
    /// 55.2 trusted them: a file of 0.25 and NaN read as 0.25 throughout,
    /// `max` was answered from them, and files, row groups and pages holding
    /// a matching NaN were dropped. Every query over the Parquet table answers
    /// as over the same rows in memory, with or without row-level pushdown;
    /// conjuncts over other columns still prune.
    #[tokio::test]
    async fn parquet_answers_as_memory_over_nan_and_minus_zero() {
        let dir = std::env::temp_dir().join(format!("setfusion-float-stats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let nan = "CAST('NaN' AS DOUBLE)";
        let (ctx, _) = session(
            2,
            &[
                &format!(
                    "CREATE TABLE a AS SELECT * FROM (VALUES (0.25, 1), ({nan}, 2), (0.25, 3), (0.25, 4)) t(f, k)"
                ),
                &format!(
                    "CREATE TABLE b AS SELECT * FROM (VALUES (-0.0, 5), (-0.0, 6), (-{nan}, 7), (0.5, 8)) t(f, k)"
                ),
                "CREATE TABLE m AS SELECT * FROM a UNION ALL SELECT * FROM b",
            ],
        )
        .await;
        for (t, name) in [("a", "1"), ("b", "2")] {
            let to = dir.join(format!("{name}.parquet"));
            let copy = format!(
                "COPY {t} TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '2', \
                 'format.bloom_filter_on_write' 'true')",
                to.display()
            );
            ctx.sql(&copy).await.unwrap().collect().await.unwrap();
        }
        let location = format!("{}/", dir.display());
        ctx.register_parquet("p", &location, Default::default()).await.unwrap();
        let queries = [
            "SELECT f, k FROM {t}",
            "SELECT max(f), min(f), count(*) FROM {t}",
            "SELECT k FROM {t} WHERE f > 1",
            "SELECT k FROM {t} WHERE f < -1",
            "SELECT k FROM {t} WHERE f = 'NaN'",
            "SELECT k FROM {t} WHERE f = 0.0",
            "SELECT k FROM {t} WHERE f <> 0.25",
            "SELECT k FROM {t} WHERE f > 1 AND k > 1",
            "SELECT k FROM {t} WHERE f BETWEEN 0.3 AND 1",
            "SELECT k FROM {t} WHERE f >= -1 AND f < 'NaN'",
            "SELECT k FROM {t} WHERE f = 0.5",
            "SELECT k FROM {t} WHERE f = -0.0",
            "SELECT f FROM {t} ORDER BY f DESC LIMIT 2",
            "SELECT f FROM {t} ORDER BY f LIMIT 1",
            "SELECT f FROM {t} EXCEPT ALL SELECT f FROM {t} WHERE k > 3",
        ];
        for pushdown in [false, true] {
            let set = format!("SET datafusion.execution.parquet.pushdown_filters = {pushdown}");
            ctx.sql(&set).await.unwrap().collect().await.unwrap();
            for q in queries {
                let rows = |t: &str| {
                    let sql = q.replace("{t}", t);
                    let ctx = ctx.clone();
                    async move {
                        let plan = ctx.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
                        let shown = displayable(plan.as_ref()).indent(true).to_string();
                        (sorted_rows(&collect(plan, ctx.task_ctx()).await.unwrap()), shown)
                    }
                };
                let ((want, _), (got, plan)) = (rows("m").await, rows("p").await);
                assert_eq!(got, want, "{q} (pushdown_filters = {pushdown})\n{plan}");
            }
        }
        // The float conjunct is hidden from the pruning; k's still prunes.
        let plan = ctx.sql("EXPLAIN SELECT k FROM p WHERE f > 1 AND k > 1").await.unwrap().collect().await.unwrap();
        let shown = sorted_rows(&plan).join("\n");
        assert!(shown.contains("setfusion_unpruned(f@0 > 1)"), "{shown}");
        assert!(shown.contains("pruning_predicate=k_null_count"), "{shown}");
        // A range closed on both sides (no NaN is in it) still prunes.
        let plan = ctx.sql("EXPLAIN SELECT k FROM p WHERE f BETWEEN 0.3 AND 1").await.unwrap().collect().await.unwrap();
        let shown = sorted_rows(&plan).join("\n");
        assert!(!shown.contains("setfusion_unpruned") && shown.contains("f_max"), "{shown}");
        // Trusted (data known to hold no NaN): DataFusion's own scan and statistics.
        ctx.sql("SET setfusion.trust_float_statistics = true").await.unwrap().collect().await.unwrap();
        let plan = ctx.sql("EXPLAIN SELECT k FROM p WHERE f > 1").await.unwrap().collect().await.unwrap();
        let shown = sorted_rows(&plan).join("\n");
        assert!(!shown.contains("setfusion_unpruned") && shown.contains("f_max"), "{shown}");
        // DataFusion 55.2 alone reads file 1's NaN as 0.25 (were it mended, this would say so).
        ctx.sql("SET setfusion.enabled = false").await.unwrap().collect().await.unwrap();
        let plain = sorted_rows(&ctx.sql("SELECT f, k FROM p").await.unwrap().collect().await.unwrap());
        assert!(plain.contains(&"0.25|2".to_string()), "{plain:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

mod partitioned_parquet {
    use super::{session, sorted_rows};

    /// Hash-partitioned set operations (`hash_partition_inputs`, as on a
    /// cluster) over Parquet: DataFusion splits a one-file input into byte
    /// ranges, and now hash-repartitions it for the operator too (it had
    /// left four unhashed partitions under the operator's KeyPartitioned
    /// requirement, and SanityCheckPlan refused the plan).
    #[tokio::test]
    async fn a_split_parquet_input_is_hash_partitioned() {
        let dir = std::env::temp_dir().join(format!("setfusion-partitioned-pq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ctx, _) = session(
            4,
            &[
                "SET setfusion.strategy = 'cpu'",
                "SET setfusion.hash_partition_inputs = true",
                // Split even a small file into byte ranges.
                "SET datafusion.optimizer.repartition_file_min_size = 1",
                "CREATE TABLE a AS SELECT v % 10 AS k FROM generate_series(1, 5) g(v)",
                "CREATE TABLE b AS SELECT v % 1000 AS k FROM generate_series(1, 40000) g(v)",
            ],
        )
        .await;
        for t in ["a", "b"] {
            let copy = format!("COPY {t} TO '{}' STORED AS PARQUET", dir.join(format!("{t}/0.parquet")).display());
            ctx.sql(&copy).await.unwrap().collect().await.unwrap();
            ctx.register_parquet(format!("p{t}"), &format!("{}/{t}/", dir.display()), Default::default())
                .await
                .unwrap();
        }
        for (sql, want) in [
            ("SELECT k FROM pa INTERSECT ALL SELECT k FROM pb", vec!["1", "2", "3", "4", "5"]),
            ("SELECT k FROM pb INTERSECT SELECT k FROM pa", vec!["1", "2", "3", "4", "5"]),
            ("SELECT k FROM pa EXCEPT ALL SELECT k FROM pb", vec![]),
        ] {
            let got = sorted_rows(&ctx.sql(sql).await.unwrap().collect().await.unwrap());
            assert_eq!(got, want, "{sql}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

mod float_in_list {
    use super::{session, sorted_rows};

    /// DataFusion 55.2 looks IN lists of more than three literals up in a hash
    /// set of their bits, where -0.0 and 0.0 differ (its `=` equates them):
    /// `f IN (0.0, 5.0, 6.0, 7.0)` missed -0.0. Every answer here is SQL's
    /// (NaNs: equal only to the NaN of the same sign), and the column keeps its name.
    #[tokio::test]
    async fn minus_zero_is_in_a_list_of_zero() {
        let nan = "CAST('NaN' AS DOUBLE)";
        let (ctx, _) = session(
            2,
            &[&format!("CREATE TABLE t AS SELECT * FROM (VALUES (-0.0), (0.0), ({nan}), (-{nan}), (1.0)) t(f)")],
        )
        .await;
        let rest = "5.0, 6.0, 7.0";
        for (sql, want) in [
            (format!("SELECT f FROM t WHERE f IN (0.0, {rest})"), vec!["-0.0", "0.0"]),
            (format!("SELECT f FROM t WHERE f IN (-0.0, {rest})"), vec!["-0.0", "0.0"]),
            (format!("SELECT f FROM t WHERE f NOT IN (0.0, {rest})"), vec!["1.0", "NaN", "NaN"]),
            (format!("SELECT f FROM t WHERE f IN ({nan}, {rest})"), vec!["NaN"]),
            (format!("SELECT f FROM t WHERE CAST(f AS REAL) IN (0.0, {rest})"), vec!["-0.0", "0.0"]),
            (format!("SELECT count(*) FROM t WHERE f IN (SELECT f FROM t WHERE f IN (0.0, {rest}))"), vec!["2"]),
        ] {
            let got = sorted_rows(&ctx.sql(&sql).await.unwrap().collect().await.unwrap());
            assert_eq!(got, want, "{sql}");
        }
        let batches = ctx.sql(&format!("SELECT f IN (0.0, {rest}) FROM t")).await.unwrap().collect().await.unwrap();
        let name = batches[0].schema().field(0).name().clone();
        // DataFusion's own name for it.
        assert_eq!(name, "t.f IN Float64(0), Float64(5), Float64(6), Float64(7)");
        assert_eq!(sorted_rows(&batches), vec!["false", "false", "false", "true", "true"]);
    }
}
