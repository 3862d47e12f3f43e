//! What several operators share, in a file of its own so that no operator's
//! file imports from another operator's (issue 29): the planner's choices every
//! operator is built with ([`Backend`], [`NullMode`]) and the task context
//! their inputs are executed with ([`input_context`]).

use std::sync::Arc;

use datafusion::execution::TaskContext;

use crate::config::Strategy;

/// Where the selection runs, decided at planning time.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// GPU backend with the configured strategy (`auto` picks at run time).
    Gpu(Strategy),
    /// CPU backend, with the reason it was chosen.
    Cpu(String),
}

/// NULL semantics of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullMode {
    /// Equi-join: a NULL key matches nothing.
    NeverEqual,
    /// Set operations (and IS NOT DISTINCT FROM joins): NULL equals NULL.
    Equal,
    /// NOT IN: SQL three-valued logic (any NULL on the other side, or a NULL
    /// kept-side key, removes the row unless the other side is empty).
    NullAware,
}

/// The inputs are executed with at least this batch size. The operators read
/// all of both inputs before they output a row, so their batch size only sets
/// how many batches they handle, each with its own bookkeeping (key arrays,
/// selection slices, packing pieces): a 100M-row in-memory table comes as
/// 12,288 batches of 8,192 rows (DataSourceExec splits its 65,536-row batches
/// to the session's batch size), or as 1,536.
const INPUT_BATCH_ROWS: usize = 1 << 16;

/// `context` with a session batch size of at least [`INPUT_BATCH_ROWS`], for executing the inputs.
pub(crate) fn input_context(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let config = context.session_config();
    if config.batch_size() >= INPUT_BATCH_ROWS {
        return context.clone();
    }
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config.clone().with_batch_size(INPUT_BATCH_ROWS),
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}
