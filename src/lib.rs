//! setfusion: GPU-accelerated set operators for Apache DataFusion.
//!
//! ```text
//! let state = setfusion::install(SessionStateBuilder::new().with_default_features()).build();
//! let ctx = SessionContext::new_with_state(state);
//! ```
//! installs the exact INTERSECT/EXCEPT [ALL] step, the GPU semi/anti join rule
//! and the `setfusion.*` settings (`SET setfusion.enabled = false`, ...).

pub mod algo;
pub mod bench;
pub mod cli;
pub mod config;
pub mod datagen;
pub mod env;
pub mod exec;
pub mod fuzz;
pub mod gpu;
pub mod keys;
pub mod planner;
pub mod slt;
pub mod udf;
pub mod util;

use std::sync::Arc;

use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use config::SetfusionConfig;

/// Add setfusion to a session builder (call after `with_default_features()`).
/// Starts the configured device in the background (no-op without a driver or
/// with `SETFUSION_DISABLE_GPU=1`).
pub fn install(builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut builder = builder;
    let config = builder.config().get_or_insert_with(SessionConfig::new).clone();
    let config = if config.options().extensions.get::<SetfusionConfig>().is_some() {
        config
    } else {
        config.with_option_extension(SetfusionConfig::default())
    };
    // The device starts now, in the background, while the caller registers
    // tables, plans and scans (issue 13); planning never waits for it.
    if let Some(cfg) = config.options().extensions.get::<SetfusionConfig>() {
        if cfg.enabled {
            gpu::start_in_background(cfg.device);
        }
    }
    // Similarity and tokenizer functions (issue 4), added to whatever is registered.
    builder.scalar_functions().get_or_insert_with(Vec::new).extend(udf::functions());
    // Multiset aggregate (issue 15).
    builder.aggregate_functions().get_or_insert_with(Vec::new).extend(udf::aggregate_functions());
    // intersect_families (issue 15, seed 000).
    builder.table_functions().get_or_insert_with(Default::default).insert(
        udf::families::NAME.to_string(),
        Arc::new(datafusion::catalog::TableFunction::new(udf::families::NAME.to_string(), Arc::new(udf::families::IntersectFamilies))),
    );
    // The semi/anti join rule runs right after DataFusion's join selection and
    // before distribution enforcement: a replaced join then gets no hash
    // repartitioning of its inputs (the operator reads all of them at once).
    let mut rules = PhysicalOptimizer::new().rules;
    let at = rules.iter().position(|r| r.name() == "join_selection").map_or(rules.len(), |i| i + 1);
    rules.insert(at, Arc::new(planner::SemiJoinRule));
    rules.push(Arc::new(planner::SimilarityJoinRule));
    builder
        .with_config(config)
        .with_analyzer_rule(Arc::new(planner::SetOpRule))
        .with_analyzer_rule(Arc::new(planner::MarkJoinRule))
        .with_physical_optimizer_rules(rules)
        .with_query_planner(Arc::new(planner::SetfusionQueryPlanner))
}

/// A `SessionContext` with DataFusion's defaults plus setfusion.
pub fn context() -> SessionContext {
    context_with_config(SessionConfig::new())
}

/// Like [`context`] with a caller-provided configuration.
pub fn context_with_config(config: SessionConfig) -> SessionContext {
    let state = install(SessionStateBuilder::new().with_config(config).with_default_features()).build();
    SessionContext::new_with_state(state)
}
